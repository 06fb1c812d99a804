"""What a vLLM start-up log says about speculative decoding (check-log's `speculative_in_log`).

Where vLLM states it: the non-default arguments (`'speculative_config': {'method': ..., 'num_speculative_tokens':
N, 'model': ...}`, 0.10 on), the engine's config line (`speculative_config=SpeculativeConfig(method='mtp',
model='...', num_spec_tokens=N)`, vllm/config/speculative.py's __repr__, V1), the command line
(`--speculative-config '{...}'`), and before 0.8 the flags `--speculative-model [ngram]` and
`--num-speculative-tokens N`. V0's spec_decode_worker.py prints `[Speculative Decoding]` lines without the method.
V1's gpu_model_runner.py load_model prints "Loading drafter model..." and loads the drafter inside the same memory
measurement as the target, so its "Model loading took X GiB" counts both; vllm/v1/spec_decode/eagle.py prints
whether the head shares the target's embedding and lm_head.
"""

from __future__ import annotations

import re

from kvbudget.speculative import LoggedAcceptance, LoggedSpeculative, SpecMethod

# vLLM's method names (SpeculativeConfig.method) -> kvbudget's; the per-family MTP names (deepseek_mtp,
# qwen3_next_mtp, ...) end in "mtp"; medusa, mlp_speculator and dflash have no kvbudget method.
METHODS: dict[str, SpecMethod | None] = {"eagle": SpecMethod.EAGLE, "eagle3": SpecMethod.EAGLE3,
                                         "draft_model": SpecMethod.DRAFT_MODEL, "mtp": SpecMethod.MTP,
                                         "ngram": SpecMethod.NGRAM, "[ngram]": SpecMethod.NGRAM,
                                         "ngram_gpu": SpecMethod.NGRAM, "suffix": SpecMethod.SUFFIX}

_CONFIGS = (r"'speculative_config': (\{[^}]*\})", r"speculative_config=SpeculativeConfig\(([^)]*)\)",
            r"--speculative[-_]config[ =]+'?(\{[^}]*\})")


def _value(config: str, *keys: str) -> str | None:
    """A key's value in a dict, JSON object or dataclass repr as the log prints it."""
    for key in keys:
        if m := re.search(rf"['\"]?\b{key}['\"]?\s*[:=]\s*['\"]?([^'\",}}\s)]+)", config):
            return m.group(1)
    return None


def _line(text: str, at: int) -> str:
    """The whole log line around position `at`."""
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    return text[start:end if end >= 0 else len(text)]


def read_speculative(text: str) -> LoggedSpeculative | None:
    """The speculative settings and drafter lines of a vLLM log; None where it runs none."""
    config, at = None, -1
    for pattern in _CONFIGS:
        if m := re.search(pattern, text):
            config, at = m.group(1), m.start()
            break
    if config is None and (m := re.search(r"--speculative[-_]model[ =]+(\S+)", text)):
        config, at = f"model={m.group(1)}", m.start()  # before 0.8: the model (or [ngram]) and the count apart
        if n := re.search(r"--num[-_]speculative[-_]tokens[ =]+(\d+)", text):
            config += f", num_speculative_tokens={n.group(1)}"
    worker = re.search(r"\[Speculative Decoding\]|SpecDecodeWorker|Loading drafter model", text)
    if config is None and worker is None:
        return None
    name = (_value(config, "method") or "") if config else ""
    draft = _value(config, "model", "draft_model") if config else None
    if not name and draft == "[ngram]":
        name = "[ngram]"
    tokens = _value(config, "num_speculative_tokens", "num_spec_tokens") if config else None
    method = SpecMethod.MTP if name.lower().endswith("mtp") else METHODS.get(name.lower())
    lines = [_line(text, at)] if config else []
    if worker and worker.start() != at:
        lines.append(_line(text, worker.start()))
    drafter = text.find("Loading drafter model")
    loaded = re.search(r"Model loading took ([\d.]+) GiB", text)
    shares = tuple(part for part, pattern in (("embedding", r"[Ss]har\w+ (?:the same vocab |target model )?"
                                                            r"embedding"),
                                               ("lm_head", r"[Ss]har\w+ (?:the same |target model )?lm_head"))
                   if re.search(pattern, text))
    lines += [_line(text, m.start()) for m in re.finditer(r"Loading drafter model|EAGLE head|Detected MTP model",
                                                          text)]
    return LoggedSpeculative(engine_method=name, method=method, num_tokens=int(tokens) if tokens and tokens.isdigit()
                             else None,
                             draft=None if draft == "[ngram]" else draft,
                             weights_include_drafter=drafter >= 0 and loaded is not None and drafter < loaded.start(),
                             shares=shares, lines=tuple(dict.fromkeys(lines)))


# vllm/v1/spec_decode/metrics.py, SpecDecodingLogging.log (V1, 0.9 on): "SpecDecoding metrics: Mean acceptance
# length: %.2f, Accepted throughput: ..., Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%" (the
# rates "%.3f" joined by ", "); 0.10's order put "Draft acceptance rate: X%" first (pull request 24127's log). Each
# line covers the interval since the one before it.
_METRICS = re.compile(r"SpecDecoding metrics:.*")
_MEAN = re.compile(r"Mean acceptance length: ([0-9.]+)")
_PER_POSITION = re.compile(r"Per-position acceptance rate: ([0-9.]+(?:, [0-9.]+)*)")


def read_acceptance(text: str) -> LoggedAcceptance | None:
    """The last "SpecDecoding metrics" line of a vLLM log: its per-position acceptance and mean acceptance length;
    None where the log has none."""
    found = _METRICS.findall(text)
    if not found:
        return None
    line = found[-1].strip()
    mean = _MEAN.search(line)
    per = _PER_POSITION.search(line)
    return LoggedAcceptance(per_position=tuple(float(v) for v in per.group(1).split(", ")) if per else (),
                            mean_length=float(mean.group(1)) if mean else None, line=line, lines=len(found))
