"""What an SGLang start-up log says about speculative decoding (check-log's `speculative_in_log`).

SGLang states it in its server arguments (`speculative_algorithm='EAGLE3', speculative_draft_model_path='...',
speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4`, or the same as flags). NEXTN
(a model's own MTP layers) is resolved to EAGLE before the arguments are printed (server_args.py), so EAGLE without
a draft model path is the model's own layers. The drafter is a second worker (speculative/eagle_worker.py): its
model runner prints its own `Load weight end. type=..., mem usage=X GB` after the target's, and its own pool line
`KV Cache is allocated. #tokens: N, ...` after the target's: the draft pool is sized apart, to the target's tokens
plus a headroom for the draft and verify tokens of every running request (model_runner.py, draft_runner_cache_size).
Each rank prints its own lines (`[... TP0]`); the first rank's are read.
"""

from __future__ import annotations

import re

from kvbudget.speculative import LoggedAcceptance, LoggedSpeculative, SpecMethod

# SGLang's algorithm names (SpeculativeAlgorithm) -> kvbudget's; EAGLE is the model's own layers without a draft
# model path (see above); DFLASH has no kvbudget method.
METHODS: dict[str, SpecMethod | None] = {"eagle": SpecMethod.EAGLE, "eagle3": SpecMethod.EAGLE3,
                                         "nextn": SpecMethod.MTP, "standalone": SpecMethod.DRAFT_MODEL,
                                         "ngram": SpecMethod.NGRAM, "lookahead": SpecMethod.NGRAM}
DRAFT_TYPES = r"type=\w*(?:Eagle|MTP|NextN|Draft)"  # the draft worker's model classes (LlamaForCausalLMEagle3, ...)


def _setting(text: str, name: str, *flags: str) -> tuple[str | None, int]:
    """A server argument as printed (name='value' or name=value) or as a flag; its value and where it stands."""
    for m in re.finditer(rf"{name}=(?:'([^']*)'|([\w.\-/]+))", text):  # a literal start: a fast scan of long logs
        if m.start() == 0 or not (text[m.start() - 1].isalnum() or text[m.start() - 1] == "_"):
            return m.group(1) or m.group(2), m.start()
    for flag in flags:
        if found := re.search(rf"--{flag}[ =]+([^\s'\"\\]+)", text):
            return found.group(1), found.start()
    return None, -1


def _count(text: str, key: str) -> int | None:
    """A speculative count (speculative_<key>) as the log states it, where it is a whole number."""
    value, _ = _setting(text, f"speculative_{key}", f"speculative-{key.replace('_', '-')}")
    return int(value) if value and value.isdigit() else None


def _line(text: str, at: int) -> tuple[int, str]:
    """Where the line around position `at` starts, and the line."""
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    return start, text[start:end if end >= 0 else len(text)]


def _rank(line: str) -> str:
    m = re.search(r"\b((?:[DTPE]P\d+ ?)+)\]", line)
    return m.group(1).strip() if m else ""


def read_speculative(text: str) -> LoggedSpeculative | None:
    """The speculative settings, the draft worker's weights and its pool of an SGLang log; None where it runs
    none."""
    name, at = _setting(text, "speculative_algorithm", "speculative-algorithm", "speculative-algo")
    if name in (None, "None"):
        return None
    draft, _ = _setting(text, "speculative_draft_model_path", "speculative-draft-model-path", "speculative-draft")
    steps, topk, drafts = (_count(text, key) for key in ("num_steps", "eagle_topk", "num_draft_tokens"))
    model, _ = _setting(text, "model_path", "model-path", "model")
    draft = None if draft in (None, "None") else draft
    method = METHODS.get(str(name).lower())
    if method is SpecMethod.EAGLE and (draft is None or draft == model):
        method = SpecMethod.MTP
    lines = [_line(text, at)[1]]
    loads = [_line(text, m.start()) for m in re.finditer(r"Load weight end\b", text)]
    pools = [_line(text, m.start()) for m in re.finditer(r"KV Cache is allocated\.", text)]
    rank = _rank((loads or pools or [(0, "")])[0][1])
    loads = [(pos, line) for pos, line in loads if _rank(line) == rank]
    pools = [(pos, line) for pos, line in pools if _rank(line) == rank]
    drafter = loads[1] if len(loads) > 1 else loads[0] if loads and re.search(DRAFT_TYPES, loads[0][1]) else None
    weights = re.search(r"mem usage=([\d.]+) GB", drafter[1]) if drafter else None
    target_pool = next((line for pos, line in pools if drafter is None or pos < drafter[0]), None)
    draft_pool = next((line for pos, line in pools if drafter is not None and pos > drafter[0]), None) or (
        pools[1][1] if drafter is None and len(pools) > 1 else None)
    lines += [line for line in (drafter[1] if drafter else None, draft_pool) if line]

    def tokens(line: str | None) -> int | None:
        return int(m.group(1)) if line and (m := re.search(r"#tokens: (\d+)", line)) else None

    size = sum(float(x) for x in re.findall(r"(?:K|V|KV) size: ([\d.]+) GB", draft_pool)) if draft_pool else None
    return LoggedSpeculative(engine_method=str(name), method=method, num_tokens=steps if topk == 1 else None,
                             num_steps=steps, topk=topk, num_draft_tokens=drafts, draft=draft,
                             drafter_weights_gib=float(weights.group(1)) if weights else None,
                             pool_tokens=tokens(target_pool), draft_pool_tokens=tokens(draft_pool),
                             draft_pool_gib=size or None, lines=tuple(lines))


# How SGLang sizes its pools when it drafts (model_executor/model_runner.py init_memory_pool, and
# model_runner_kv_cache_mixin.py from 0.5.7), read in the wheels of 0.4.2 and 0.4.3 (the first era), 0.4.4, 0.4.5,
# 0.4.6.post5, 0.5.2 and 0.5.6 (the second) and 0.5.7 to 0.5.10 (the third); later releases are not read:
# - to 0.4.3 the target's pool is the profiled count and the draft worker's is that plus max_num_reqs x
#   speculative_num_steps + 100;
# - 0.4.4 to 0.5.6 both pools are the profiled count plus max_num_reqs x (speculative_num_steps x
#   speculative_eagle_topk + speculative_num_draft_tokens) + 100 (the draft and verify tokens of every request);
# - 0.5.7 to 0.5.10 both are the profiled count.
# max_num_reqs is max_running_requests where given, else min(max(profiled / context_len x 512, 2048), 4096).
ERAS = (((0, 0, 0), (0, 4, 3), "draft"), ((0, 4, 4), (0, 5, 6), "both"), ((0, 5, 7), (0, 5, 10), "none"))


def _era(version: str | None) -> str | None:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    release = tuple(int(x) for x in m.groups()) if m else None
    return next((name for low, high, name in ERAS if release and low <= release <= high), None)


def max_num_reqs(text: str, profiled: int, context_len: int) -> int:
    """The requests SGLang sizes the drafter's headroom for: max_running_requests as the log states it, else its
    estimate from the profiled pool and the context length."""
    stated, _ = _setting(text, "max_running_requests", "max-running-requests")
    if stated not in (None, "None"):
        return int(str(stated))
    return min(max(int(profiled / context_len * 512), 2048), 4096)


def pool_headroom(version: str | None, logged: LoggedSpeculative, reqs: int) -> int | None:
    """Tokens the target's pool holds beyond the profiled count because it drafts (`reqs` requests); None where
    the release is not stated or not read, or the log leaves out the draft settings the rule needs."""
    era = _era(version)
    if era == "both":
        if None in (logged.num_steps, logged.topk, logged.num_draft_tokens):
            return None
        return reqs * (logged.num_steps * logged.topk + logged.num_draft_tokens) + 100  # type: ignore[operator]
    return 0 if era in ("draft", "none") else None


def draft_pool_rule(version: str | None, logged: LoggedSpeculative, reqs: int) -> int | None:
    """The draft worker's pool by the release's rule, from the target's pool the log printed; None where unknown."""
    era, target = _era(version), logged.pool_tokens
    if target is None or era is None:
        return None
    if era == "draft":
        return None if logged.num_steps is None else target + reqs * logged.num_steps + 100
    return target


# python/sglang/srt/managers/scheduler_metrics_mixin.py, log_decode_stats: with a drafter, each "Decode batch" line
# carries "accept len: %.2f" (the tokens each verification gave over the interval, the bonus token included; newer
# releases add "accept rate: %.2f"). SGLang prints no per-position figures. That the length counts the bonus token:
# the lines of sgl-kernel-npu pull request 608 (tests/data/logs/speculative) print accept rate = (accept len - 1) / 3
# for their 3 draft tokens (3.05 and 0.68, 2.63 and 0.54, 2.83 and 0.61).
_ACCEPT_LEN = re.compile(r"Decode batch.*?accept len: ([0-9.]+).*")


def read_acceptance(text: str) -> LoggedAcceptance | None:
    """The last "Decode batch" line of an SGLang log that gives an accept length; None where none does."""
    found = list(_ACCEPT_LEN.finditer(text))
    if not found:
        return None
    last = found[-1]
    return LoggedAcceptance(mean_length=float(last.group(1)), line=last.group(0).strip(), lines=len(found))
