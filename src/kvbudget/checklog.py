"""`kvbudget check-log`: an engine's startup log beside kvbudget's prediction for the same settings.

Reads what vLLM (V0 and V1, GPU and CPU builds) and llama-server print about their KV cache; finds the
model and settings in the log; recomputes blocks, tokens, concurrency and buffer sizes with the engine
modules; and says where they differ and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kvbudget.engines import EngineOptions
from kvbudget.engines.llamacpp import LLAMACPP
from kvbudget.engines.vllm import VLLM
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.units import GIB, MIB

_DTYPES = {"f16": "float16", "f32": "float32", "bf16": "bfloat16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1",
           "q5_0": "q5_0", "q5_1": "q5_1", "iq4_nl": "iq4_nl"}


@dataclass(frozen=True)
class Row:
    quantity: str
    logged: str
    predicted: str
    matches: bool
    note: str = ""


@dataclass(frozen=True)
class LogCheck:
    engine: str
    model_in_log: str | None  # the model path or name the log names
    settings: dict
    rows: tuple[Row, ...]

    @property
    def all_match(self) -> bool:
        return all(r.matches for r in self.rows)

    def to_dict(self) -> dict:
        return {"engine": self.engine, "model_in_log": self.model_in_log, "settings": self.settings,
                "all_match": self.all_match, "rows": [r.__dict__ for r in self.rows]}


def detect_engine(text: str) -> str:
    if re.search(r"llama_kv_cache|llama_context:|llama_model_loader", text):
        return "llamacpp"
    if re.search(r"KV Cache is allocated\. #tokens", text):
        return "sglang"
    if re.search(r"KV-cache blocks: \d+, size: \d+", text):
        return "tgi"
    if re.search(r"KV cache size: [\d,]+ tokens|GPU blocks: \d+|Maximum concurrency for|V1 LLM engine", text):
        return "vllm"
    raise KVBudgetError("check-log: found no vLLM, SGLang, TGI or llama.cpp KV cache lines in the log; pass a "
                        "startup log (vLLM: 'KV cache size' / 'Maximum concurrency'; SGLang: 'KV Cache is allocated'; TGI: 'KV-cache blocks'; "
                        "llama.cpp: 'llama_kv_cache: size')")


def model_in_log(text: str) -> str | None:
    """The model the log names: vLLM's model='...', or llama.cpp's GGUF path (its folder's config.json)."""
    m = (re.search(r"model='([^']+)'", text) or re.search(r"model_path='([^']+)'", text)
         or re.search(r"(?:vllm serve|--model-path|--model)\s+(\S+)", text))
    if m:
        return m.group(1)
    m = re.search(r"tensors from (\S+\.gguf)", text)
    if m:
        return str(Path(m.group(1)).parent)
    return None


def check_log(text: str, model: ModelSpec) -> LogCheck:
    engine = detect_engine(text)
    return {"vllm": _check_vllm, "sglang": _check_sglang, "llamacpp": _check_llamacpp,
            "tgi": _check_tgi}[engine](text, model)


def _check_tgi(text: str, model: ModelSpec) -> LogCheck:
    """TGI prints its block count and size, and the max_batch_total_tokens they make; the budget they imply
    follows from kvbudget's bytes per token for the model (every layer full, MLA expanded)."""
    from kvbudget.engines.tgi import TGI

    m = re.search(r"KV-cache blocks: (\d+), size: (\d+)", text)
    blocks, size = int(m.group(1)), int(m.group(2))
    shards = int(s.group(1)) if (s := re.search(r"(?:--num-shard|NUM_SHARD=|num_shard:?)[ =]?(\d+)", text)) else 1
    rows = [Row("KV-cache blocks", f"{blocks:,} of {size}", "-", True, "read from the log")]
    total = re.search(r"(?:max batch total tokens to\s+|MAX_BATCH_TOTAL_TOKENS\W+)(\d+)", text)
    if total:
        rows.append(Row("max batch total tokens", f"{int(total.group(1)):,}", f"{blocks * size:,}",
                        int(total.group(1)) == blocks * size, "TGI: blocks x block size"))
    alloc = TGI.allocate(model, "auto", shards, EngineOptions(block_size=size if size in (1, 16, 256) else None))
    rows.append(Row("KV memory per shard", "-", f"{blocks * size * alloc.bytes_per_token / GIB:.2f} GiB", True,
                    f"implied by {alloc.bytes_per_token:,} bytes per token for {model.name}"))
    return LogCheck("tgi", model_in_log(text), {"num_shard": shards, "block_size": size}, tuple(rows))


def _check_sglang(text: str, model: ModelSpec) -> LogCheck:
    """SGLang prints its pool in tokens and the K and V buffer sizes ("GB" meaning GiB) per rank."""
    from kvbudget.engines.sglang import SGLANG

    m = re.search(r"#tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB", text)
    if not m:
        raise KVBudgetError("check-log: the SGLang log lacks 'KV Cache is allocated. #tokens: N, K size: ..., V size'")
    tokens, k_logged, v_logged = int(m.group(1)), m.group(2), m.group(3)
    tp = int(t.group(1)) if (t := re.search(r"(?:--tp(?:-size)?|tp_size=)[ =]?(\d+)", text)) else 1
    dtype = d.group(1) if (d := re.search(r"--kv-cache-dtype[ =](\w+)", text)) else "auto"
    alloc = SGLANG.allocate(model, dtype, tp)
    k_bytes = v_bytes = 0
    for layer in model.layers:
        if layer.kind in ("full_attention", "sliding_window", "chunked_local"):
            heads = max(1, layer.kv_heads // tp)
            k_bytes += alloc.kv_dtype.bytes_for(heads * layer.k_dim)
            v_bytes += alloc.kv_dtype.bytes_for(heads * layer.v_dim)
        elif layer.kind == "latent_attention":
            k_bytes += alloc.kv_dtype.bytes_for(layer.latent_dim)
            v_bytes += alloc.kv_dtype.bytes_for(layer.rope_dim)
    k_ours, v_ours = f"{tokens * k_bytes / GIB:.2f}", f"{tokens * v_bytes / GIB:.2f}"
    rows = (
        Row("pool (tokens)", f"{tokens:,}", "-", True, "read from the log; kvbudget checks its buffer sizes"),
        Row("K buffer per rank", f"{k_logged} GB", f"{k_ours} GiB", f"{float(k_logged):.2f}" == k_ours,
            "SGLang's 'GB' are GiB"),
        Row("V buffer per rank", f"{v_logged} GB", f"{v_ours} GiB", f"{float(v_logged):.2f}" == v_ours,
            "SGLang's 'GB' are GiB"),
        Row("KV memory per rank", "-", f"{tokens * (k_bytes + v_bytes) / GIB:.2f} GiB", True,
            "the budget this pool implies"),
    )
    return LogCheck("sglang", model_in_log(text), {"tp": tp, "kv_cache_dtype": dtype}, rows)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _check_vllm(text: str, model: ModelSpec) -> LogCheck:
    conc = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", text)
    seq = re.search(r"max_seq_len=(\d+)", text)
    max_len = int(_num(conc.group(1))) if conc else int(seq.group(1)) if seq else None
    if max_len is None:
        raise KVBudgetError("check-log: the vLLM log names no max_model_len ('Maximum concurrency for N tokens')")
    cpu = bool(re.search(r"CPU KV cache size|device_config=cpu", text))
    tp = int(m.group(1)) if (m := re.search(r"tensor_parallel_size=(\d+)", text)) else 1
    pp = int(m.group(1)) if (m := re.search(r"pipeline_parallel_size=(\d+)", text)) else 1
    kv_dtype = m.group(1) if (m := re.search(r"kv_cache_dtype=(\w+)", text)) else "auto"
    prefix = not re.search(r"enable_prefix_caching=False", text)
    mnbt = int(m.group(1)) if (m := re.search(r"max_num_batched_tokens=(\d+)", text)) else None

    budget_text = None
    for pattern in (r"Explicitly set \(([\d.]+)/", r"Available KV cache memory: ([\d.]+) GiB",
                    r"kv_cache_size=([\d.]+) ?GiB", r"reserved for KV Cache is ([\d.]+) ?GiB"):
        if m := re.search(pattern, text):
            budget_text = m.group(1)
            break
    if budget_text is None:
        raise KVBudgetError("check-log: the vLLM log states no KV budget ('Available KV cache memory' or "
                            "'kv_cache_size=' or 'Explicitly set'); run vLLM at INFO level")
    decimals = len(budget_text.split(".")[1]) if "." in budget_text else 0
    half_step = 0.5 * 10 ** -decimals
    value = float(budget_text)
    exact = cpu and value == int(value)  # VLLM_CPU_KVCACHE_SPACE is whole GiB
    lo, hi = (value, value) if exact else (max(value - half_step, 0), value + half_step)
    options = EngineOptions(device="cpu" if cpu else "cuda", prefix_caching=prefix, max_num_batched_tokens=mnbt)

    def cap(gib: float):
        return VLLM.capacity(model, int(gib * GIB), max_len, kv_dtype=kv_dtype, tp=tp, options=options)

    low, high = cap(lo), cap(hi)
    rounding = "" if exact else f"the log rounds the budget to {decimals} decimals of GiB: a range of predictions"
    rows = [Row("KV budget", f"{budget_text} GiB", f"{lo:g}-{hi:g} GiB" if not exact else f"{value:g} GiB", True,
                "read from the log")]
    blocks = re.search(r"GPU blocks: (\d+)", text)
    if blocks:
        n = int(blocks.group(1))
        rows.append(Row("blocks", f"{n:,}", _span(low.num_blocks, high.num_blocks),
                        low.num_blocks <= n <= high.num_blocks, rounding))
    tokens = re.search(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens", text)
    if tokens:
        n = int(_num(tokens.group(1)))
        rows.append(Row("KV cache size (tokens)", f"{n:,}", _span(low.kv_cache_tokens, high.kv_cache_tokens),
                        low.kv_cache_tokens <= n <= high.kv_cache_tokens, rounding))
    if conc:
        logged = conc.group(2)
        lo_c, hi_c = f"{low.max_concurrency:.2f}", f"{high.max_concurrency:.2f}"
        ok = float(lo_c) <= float(logged) <= float(hi_c)
        rows.append(Row(f"max concurrency at {max_len:,} tokens", f"{logged}x",
                        f"{lo_c}x" if lo_c == hi_c else f"{lo_c}-{hi_c}x", ok, rounding))
    weights = re.search(r"(?:Loading model weights took|Model loading took) ([\d.]+) G", text)
    if weights:
        from kvbudget.weights import model_weights

        w = model_weights(model, tp, pp)
        logged = float(weights.group(1)) * GIB
        diff = w.per_gpu_bytes / logged - 1
        rows.append(Row("weights per GPU", f"{float(weights.group(1)):.2f} GiB", f"{w.per_gpu_bytes / GIB:.2f} GiB",
                        abs(diff) < 0.02,
                        f"{diff:+.1%}: vLLM measures allocated memory (buffers, padding); kvbudget counts parameters"))
    raised = re.search(r"Setting attention block size to (\d+) tokens", text)
    if raised:
        rows.append(Row("block size", raised.group(1), str(low.block_size), int(raised.group(1)) == low.block_size,
                        "raised so that one attention page covers a Mamba state page"))
    settings = {"max_model_len": max_len, "device": options.device, "tp": tp, "pp": pp, "kv_cache_dtype": kv_dtype,
                "prefix_caching": prefix}
    return LogCheck("vllm", model_in_log(text), settings, tuple(rows))


def _span(a: int, b: int) -> str:
    return f"{a:,}" if a == b else f"{a:,}-{b:,}"


_LLAMA_LINE = re.compile(r"(llama_kv_cache|llama_memory_recurrent): size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) "
                         r"layers, +(\d+)(?:/(\d+))? seqs[^)]*\), (?:K|R) \((\w+)\): +([\d.]+) MiB, (?:V|S) "
                         r"\((\w+)\): +([\d.]+) MiB")


def _check_llamacpp(text: str, model: ModelSpec) -> LogCheck:
    def setting(name: str) -> str | None:
        m = re.search(rf"llama_context: {name} += (\S+)", text)
        return m.group(1) if m else None

    n_ctx, n_seq = setting("n_ctx"), setting("n_seq_max")
    if n_ctx is None or n_seq is None:
        raise KVBudgetError("check-log: the llama.cpp log lacks 'llama_context: n_ctx' / 'n_seq_max' lines; "
                            "run llama-server with -lv 4 (or --verbose)")
    unified = setting("kv_unified") == "true"
    n_ubatch = int(setting("n_ubatch") or 512)
    swa_full = "using full-size SWA cache" in text
    lines = _LLAMA_LINE.findall(text)
    if not lines:
        raise KVBudgetError("check-log: no 'llama_kv_cache: size = ...' line in the llama.cpp log")
    k_type = _DTYPES.get(lines[0][6], lines[0][6])
    # n_ctx as logged is already padded and multiplied out; the per-slot size follows from it.
    ours = LLAMACPP.server_buffers(model, int(n_ctx), int(n_seq), k_type, unified=unified, swa_full=swa_full,
                                   n_ubatch=n_ubatch)
    kv_ours = [b for b in ours if b.name != "recurrent"] + [b for b in ours if b.name == "recurrent"]
    rows = []
    logged_order = [l for l in lines if l[0] == "llama_kv_cache"] + [l for l in lines if l[0] != "llama_kv_cache"]
    if len(logged_order) != len(kv_ours):
        rows.append(Row("caches", str(len(logged_order)), str(len(kv_ours)), False,
                        "different cache structure (windows or recurrent layers handled differently)"))
    for line, buf in zip(logged_order, kv_ours):
        label = {"kv": "KV cache", "kv_swa": "SWA KV cache", "recurrent": "recurrent state"}[buf.name]
        rows.append(Row(f"{label}: cells", line[2], str(buf.cells), int(line[2]) == buf.cells))
        rows.append(Row(f"{label}: layers", line[3], str(buf.layers), int(line[3]) == buf.layers))
        logged_mib = line[1]
        ours_mib = f"{buf.total_bytes / MIB:.2f}"
        rows.append(Row(f"{label}: size", f"{logged_mib} MiB", f"{ours_mib} MiB", f"{float(logged_mib):.2f}" == ours_mib,
                        "llama.cpp prints two decimals of MiB"))
    settings = {"n_ctx": int(n_ctx), "n_seq_max": int(n_seq), "kv_unified": unified, "swa_full": swa_full,
                "cache_type_k": k_type, "n_ubatch": n_ubatch}
    return LogCheck("llamacpp", model_in_log(text), settings, tuple(rows))
