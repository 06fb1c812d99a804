"""Turn public per-operation GPU profiles into the measurement files kvbudget fits its step times on.

Usage: python scripts/extract_step_profiles.py LLMSERVINGSIM_GIT VIDUR_GIT AICONFIGURATOR_GIT

The arguments are git directories of the public repositories (casys-kaist/LLMServingSim at 5daddb2,
microsoft/vidur, and ai-dynamo/aiconfigurator at 095f58a), read with `git show`; nothing else is read.
aiconfigurator's tables are parquet files: reading them needs pyarrow (`pip install pyarrow`; only this script
does). Each profile row becomes one measurement with the work it did: FLOPs and bytes moved, counted from the
profiled model's published config (kvbudget's catalog) or, for aiconfigurator, from the shapes the table gives.
The rows are written to src/kvbudget/data/steptimes/<gpu>.csv; data/steptimes/README.md names the sources.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

from kvbudget.model.load import load_model

OUT = Path(__file__).resolve().parent.parent / "src" / "kvbudget" / "data" / "steptimes"
FIELDS = ["op", "layer", "model", "tp", "tokens", "seqs", "flops", "bytes", "time_us"]
BF16 = 2

# (GPU file, model catalog name, profile folder, TP degrees) of LLMServingSim's vLLM 0.19 profiler output
V1 = [("rtx-4090", "llama-3.1-8b", "profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16", (1,)),
      ("rtx-pro-6000", "llama-3.1-8b", "profiler/perf/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16", (1, 2)),
      ("rtx-pro-6000", "qwen3-32b", "profiler/perf/RTXPRO6000/Qwen/Qwen3-32B/bf16", (1, 2)),
      ("rtx-pro-6000", "qwen3-30b-a3b", "profiler/perf/RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16", (1, 2))]
# its earlier (vLLM V0) profiler's H100 output
V0 = [("h100-sxm", "llama-3.1-8b", "profiler/v0/perf_models/H100/meta-llama/Llama-3.1-8B", (1, 2)),
      ("h100-sxm", "llama-3.1-70b", "profiler/v0/perf_models/H100/meta-llama/Llama-3.1-70B", (1, 2, 4)),
      ("h100-sxm", "mixtral-8x7b", "profiler/v0/perf_models/H100/mistralai/Mixtral-8x7B-v0.1", (1, 2, 4))]


def show(git: str, path: str) -> list[dict[str, str]]:
    text = subprocess.run(["git", f"--git-dir={git}", "show", f"HEAD:{path}"], check=True, capture_output=True,
                          text=True).stdout
    return list(csv.DictReader(io.StringIO(text)))


class Shapes:
    def __init__(self, name: str, tp: int):
        c = load_model(name).config
        c = c.get("text_config", c)
        self.h = c["hidden_size"]
        self.hd = c.get("head_dim") or self.h // c["num_attention_heads"]
        self.q = c["num_attention_heads"] * self.hd // tp
        self.kv = c["num_key_value_heads"] * self.hd // tp
        self.inter = c.get("intermediate_size", 0) // tp
        self.moe_inter = (c.get("moe_intermediate_size") or 0) // tp
        self.top_k = c.get("num_experts_per_tok") or 0
        self.vocab = c["vocab_size"] // tp
        self.tp = tp

    def gemm(self, layer: str, m: int) -> tuple[int, int] | None:
        """(FLOPs, weight bytes) of a projection over m tokens."""
        nk = {"qkv_proj": (self.q + 2 * self.kv, self.h), "q_proj": (self.q, self.h), "k_proj": (self.kv, self.h),
              "v_proj": (self.kv, self.h), "o_proj": (self.h, self.q), "gate_up_proj": (2 * self.inter, self.h),
              "gate_proj": (self.inter, self.h), "up_proj": (self.inter, self.h), "down_proj": (self.h, self.inter),
              "lm_head": (self.vocab, self.h)}.get(layer)
        if nk is None:
            return None
        n, k = nk
        return 2 * m * n * k, BF16 * n * k

    def elementwise(self, layer: str, m: int) -> int | None:
        """Bytes read and written by a normalisation, activation, rotary or embedding kernel over m tokens."""
        per_token = {"layernorm": 2 * self.h, "input_layernorm": 2 * self.h, "post_layernorm": 2 * self.h,
                     "final_layernorm": 2 * self.h, "act_fn": 3 * self.inter, "rotary_emb": 2 * (self.q + self.kv),
                     "rope": 2 * (self.q + self.kv), "qk_norm": 2 * (self.q + self.kv), "embedding": self.h}.get(layer)
        return None if per_token is None else BF16 * m * per_token

    def attention(self, chunk: int, kv_prefill: int, decodes: int, kv_decode: int) -> tuple[int, int, int]:
        """(FLOPs, KV bytes read, sequences) of one layer's attention over one prefill chunk and `decodes`
        decoding sequences."""
        pairs = chunk * kv_prefill + chunk * (chunk + 1) // 2 + decodes * (kv_decode + 1)
        flops = 4 * self.q * pairs
        kv_tokens = (kv_prefill + chunk if chunk else 0) + decodes * (kv_decode + 1)
        return flops, BF16 * 2 * self.kv * kv_tokens, decodes + (1 if chunk else 0)


def kept(tokens: int) -> bool:
    """A geometric grid of token counts (the V0 profiles measured every count from 1 to 2,048)."""
    return tokens <= 16 or (tokens <= 256 and tokens % 16 == 0) or tokens % 128 == 0


def thinned(rows: list[dict[str, object]], most: int) -> list[dict[str, object]]:
    """At most `most` rows, evenly spaced through the profile's own order."""
    step = -(-len(rows) // most)
    return rows[::step]


def row(op: str, layer: str, model: str, tp: int, tokens: int, seqs: int, flops: int, nbytes: int,
        time_us: float) -> dict[str, object]:
    return dict(op=op, layer=layer, model=model, tp=tp, tokens=tokens, seqs=seqs, flops=flops, bytes=nbytes,
                time_us=round(time_us, 4))


def v1_rows(git: str, model: str, folder: str, tp: int) -> list[dict[str, object]]:
    s, out = Shapes(model, tp), []
    for r in show(git, f"{folder}/tp{tp}/dense.csv"):
        m, t = int(r["tokens"]), float(r["time_us"])
        g = s.gemm(r["layer"], m)
        if g is not None:
            out.append(row("gemm", r["layer"], model, tp, m, 0, g[0], g[1], t))
        elif (b := s.elementwise(r["layer"], m)) is not None:
            out.append(row("elementwise", r["layer"], model, tp, m, 0, 0, b, t))
    for r in show(git, f"{folder}/tp{tp}/per_sequence.csv"):
        n, t = int(r["sequences"]), float(r["time_us"])
        if r["layer"] == "lm_head":
            g = s.gemm("lm_head", n)
            assert g is not None
            out.append(row("gemm", "lm_head", model, tp, n, n, g[0], g[1], t))
        elif r["layer"] == "sampler":
            out.append(row("sampler", "sampler", model, tp, n, n, 0, 4 * n * s.vocab * tp, t))
    grid = show(git, f"{folder}/tp{tp}/attention.csv")
    decode = [r for r in grid if r["prefill_chunk"] == "0"]  # every decode-only row; the mixed grid thinned
    for r in decode + thinned([r for r in grid if r["prefill_chunk"] != "0"], 600):
        chunk, kvp, dec, kvd = (int(r[k]) for k in ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode"))
        flops, nbytes, seqs = s.attention(chunk, kvp, dec, kvd)
        out.append(row("attention", "attention", model, tp, chunk + dec, seqs, flops, nbytes, float(r["time_us"])))
    if s.moe_inter and tp == 1:  # (profiled at TP 1 only)
        for r in show(git, f"{folder}/tp{tp}/moe.csv"):
            m, experts = int(r["tokens"]), int(r["activated_experts"])
            weights = experts * 3 * s.h * s.moe_inter
            out.append(row("moe", "experts", model, tp, m, 0, 2 * m * s.top_k * 3 * s.h * s.moe_inter,
                           BF16 * weights, float(r["time_us"])))
    return out


def v0_rows(git: str, model: str, folder: str, tp: int) -> list[dict[str, object]]:
    s, out = Shapes(model, tp), []
    for r in show(git, f"{folder}/tp{tp}/layers.csv"):
        m, t = int(r["input"]), float(r["latency(ns)"]) / 1000
        if not kept(m):
            continue
        # (its norms, activation and rotary embedding are left out: it timed PyTorch-native versions, several
        # kernels each, where vLLM runs its fused ones; the H100 takes them from the GPUs profiled under 0.19)
        g = s.gemm(r["layer_name"], m)
        if g is not None:
            out.append(row("gemm", r["layer_name"], model, tp, m, 0, g[0], g[1], t))
    # (its attention grid is left out: read as documented, its decode rows would have read KV at up to 50 TB/s
    # and its prefill rows at 40 GB/s, so what they timed is not known; H100 attention stays the roofline's)
    return out


# vLLM's custom all-reduce on H100 (what it runs for tensors up to 8 MiB on NVLink): the "vllm" rows of the
# table in github:sgl-project/sglang pull request 2904 (2025-01-15; without CUDA graphs), elements of 16 bits,
# milliseconds at TP 2 / 4 / 8
CUSTOM_ALL_REDUCE = {512: (0.0095, 0.0091, 0.0101), 4096: (0.0088, 0.0085, 0.0093), 32768: (0.0087, 0.0092, 0.0118),
                     262144: (0.0129, 0.0206, 0.0241), 524288: (0.0177, 0.0269, 0.0304),
                     1048576: (0.0266, 0.0402, 0.0450)}
CUSTOM_MAX_BYTES = 8 << 20


def custom_all_reduce() -> list[dict[str, object]]:
    return [row("allreduce", "custom_all_reduce", "-", tp, 0, 0, 0, BF16 * size, ms * 1000)
            for size, times in CUSTOM_ALL_REDUCE.items() for tp, ms in zip((2, 4, 8), times, strict=True)]


def vidur_all_reduce(git: str) -> list[dict[str, object]]:
    """NCCL's all-reduce on an H100 DGX, for the tensors above the custom all-reduce's 8 MiB."""
    out = []
    for r in show(git, "data/profiling/network/h100_dgx/all_reduce.csv"):
        n = int(r["num_workers"])
        if n in (2, 4, 8) and int(r["size"]) % 65536 in (0, 2048) and BF16 * int(r["size"]) > CUSTOM_MAX_BYTES:
            out.append(row("allreduce", "all_reduce", "-", n, 0, 0, 0, BF16 * int(r["size"]),
                           float(r["time_stats.all_reduce.median"]) * 1000))
    return out


# aiconfigurator's silicon-measured per-operation tables (Apache-2.0): (its system folder, the CSV written) for
# every GPU it measures that the catalog has; the H100 and the RTX PRO 6000 keep their files and take from it only
# the operations those lack (data/steptimes/README.md says why)
AIC_DATA = "aic-core/src/aiconfigurator_core/systems/data"
AIC = [("a100_sxm", "a100-sxm"), ("h200_sxm", "h200-sxm"), ("l40s", "l40s"), ("b200_sxm", "b200-sxm"),
       ("b300_sxm", "b300-sxm"), ("gb200", "gb200"), ("h100_sxm", "h100-sxm"), ("rtx_pro_6000_server", "rtx-pro-6000")]
AIC_ONLY = {"h100_sxm": ("attention", "moe"), "rtx_pro_6000_server": ("allreduce",)}
# the tables read, by the folder they are in (the vLLM backend's; all-reduce as vLLM runs it under CUDA graphs,
# which is its custom all-reduce or NCCL, whichever vLLM picks for the size)
AIC_TABLES = {"gemm": ("gemm", "gemm_perf"), "context": ("attention", "context_attention_perf"),
              "generation": ("attention", "generation_attention_perf"), "allreduce": ("comm", "custom_allreduce_perf"),
              "moe": ("moe", "moe_perf")}
AIC_MOST = {"gemm": 1200, "context": 700, "generation": 1200, "allreduce": 200, "moe": 500}  # rows kept per table


# decode rows whose KV read lies between these (bytes) are left out: the collector repeats one call, so a KV cache
# that fits in the GPU's L2 (40 MB on an A100, 96 MB on an L40S, 126 MB on a B200) is read from there at up to
# twice the memory's speed, where in a served step the layer's weights stream through L2 between two attention
# calls; below 1 MiB a call's time is its fixed cost either way
L2_WARM = (1 << 20, 128 << 20)


# the weight formats whose GEMM and MoE rows are taken beside the 16-bit ones (aiconfigurator's `gemm_dtype` /
# `moe_dtype`), each as op `gemm_<format>` / `moe_<format>`, and the bytes a weight of that format is stored in:
# fp8 per tensor; fp8 in 128 x 128 blocks with a float32 scale each; MXFP4 (4-bit values, an 8-bit scale per 32)
# with 16-bit activations; int4 weight-only in groups of 128 with a 16-bit scale (its collector's default,
# collector/vllm/collect_moe.py). NVFP4 and the W4A8 MXFP4 experts are left out: kvbudget counts no such checkpoint.
QUANT_BYTES = {"fp8": 1.0, "fp8_block": 1 + 4 / (128 * 128), "w4a16_mxfp4": 4.25 / 8, "int4_wo": 0.5 + 2 / 128}


# GEMM formats whose collector times one copy of the weight over and over outside CUDA graphs (collect_gemm.py:
# outside_loop_count 1 and use_cuda_graph off, where the others cycle through 6 copies under a graph): a weight
# that fits is read from L2 and each call pays Python's dispatch, so their rows are left out (fitted, the H200's
# read 9.5 TB/s, twice its memory's, with a fixed 44 us a call; a B200's 165 us); their projections are timed
# with the per-tensor fp8 kernels (steptimes.STAND_IN)
ONE_COPY = ("fp8_block",)


def quant_op(kind: str, dtype: str) -> str:
    """The op a row of weight format `dtype` is written as: `kind` for 16-bit weights, else `kind_<dtype>`."""
    return kind if dtype == "bfloat16" else f"{kind}_{dtype}"


def aic_gemm(rows: list[dict[str, object]], dtype: str = "bfloat16") -> list[dict[str, object]]:
    """GEMMs of m tokens through an n x k weight stored as `dtype`, both sides at least 512 wide (a projection's
    shapes): 2 m n k FLOPs, the n k weights' bytes in that format."""
    out = []
    per = QUANT_BYTES.get(dtype, BF16)
    for r in rows:
        m, n, k = (int(str(r[c])) for c in ("m", "n", "k"))
        if r["gemm_dtype"] == dtype and dtype not in ONE_COPY and n >= 512 and k >= 512:
            out.append(row(quant_op("gemm", dtype), f"gemm_{n}x{k}", "-", 1, m, 0, 2 * m * n * k, round(per * n * k),
                           float(str(r["latency"])) * 1000))
    return out


def aic_attention(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """16-bit attention of `batch_size` sequences: a prefill (step 0) of `isl` tokens each from scratch, or one
    decoding token each after `step` cached ones (aiconfigurator's collector: seq_lens = step + 1). FLOPs 4 x query
    width x attended pairs; bytes: the KV cache read (keys and values of every attended token). Only full
    attention (no sliding window), heads of 128, a 16-bit cache, and in the prefill table its prefill kernels."""
    out = []
    for r in rows:
        b, isl, step, heads, kv, hd = (int(str(r[c])) for c in ("batch_size", "isl", "step", "num_heads",
                                                                  "num_key_value_heads", "head_dim"))
        if (r["attn_dtype"] != "bfloat16" or r["kv_cache_dtype"] != "bfloat16" or int(str(r["beam_width"])) != 1
                or hd != 128 or int(str(r.get("window_size") or 0)) != 0
                or (step == 0 and "decode" in str(r["kernel_source"]))):
            continue
        if step == 0 and isl > 1:  # (a one-token prefill would read as a decode)
            pairs, cached, tokens = b * isl * (isl + 1) // 2, b * isl, b * isl
        elif step > 0 and isl == 1 and not L2_WARM[0] < BF16 * 2 * kv * hd * b * (step + 1) < L2_WARM[1]:
            pairs = cached = b * (step + 1)
            tokens = b
        else:
            continue
        out.append(row("attention", str(r["op_name"]), "-", 1, tokens, b, 4 * heads * hd * pairs,
                       BF16 * 2 * kv * hd * cached, float(str(r["latency"])) * 1000))
    return out


def aic_all_reduce(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """vLLM's all-reduce of `message_size` 16-bit elements over `num_gpus` GPUs, under CUDA graphs."""
    return [row("allreduce", str(r["kernel_source"]), "-", int(str(r["num_gpus"])), 0, 0, 0,
                BF16 * int(str(r["message_size"])), float(str(r["latency"])) * 1000)
            for r in rows if r["backend"] == "vllm_graph" and r["allreduce_dtype"] == "bfloat16"]


def balanced_experts(tokens: int, experts: int, topk: int) -> int:
    """How many experts aiconfigurator's "balanced" routing sends `tokens` to (collector/helper.py,
    balanced_logits: token t's j-th expert is (t + j stride) mod experts, spread evenly where tokens < stride)."""
    stride = -(-experts // topk)
    if tokens >= stride:
        return experts
    return len({int((t * stride / tokens + j * stride) % experts) for t in range(tokens) for j in range(topk)})


def aic_moe(rows: list[dict[str, object]], dtype: str = "bfloat16") -> list[dict[str, object]]:
    """Fused MoE experts stored as `dtype` on one GPU (no expert or tensor parallelism) under balanced routing:
    `num_tokens` tokens through `topk` of `num_experts` gated experts of `hidden_size` x `inter_size`: FLOPs 2 x
    tokens x topk x 3 x hidden x inter; bytes the weights of the experts the tokens reach, in that format."""
    out = []
    per = QUANT_BYTES.get(dtype, BF16)
    for r in rows:
        if (r["moe_dtype"] != dtype or r["distribution"] != "balanced" or int(str(r["moe_tp_size"])) != 1
                or int(str(r["moe_ep_size"])) != 1):
            continue
        m, h, inter, k, e = (int(str(r[c])) for c in ("num_tokens", "hidden_size", "inter_size", "topk",
                                                       "num_experts"))
        out.append(row(quant_op("moe", dtype), f"experts_{e}x{h}x{inter}", "-", 1, m, 0, 2 * m * k * 3 * h * inter,
                       round(per * balanced_experts(m, e, k) * 3 * h * inter), float(str(r["latency"])) * 1000))
    return out


AIC_PARSE = {"gemm": aic_gemm, "context": aic_attention, "generation": aic_attention, "allreduce": aic_all_reduce,
             "moe": aic_moe}


def aic_version(git: str, system: str, folder: str) -> str | None:
    """The newest vLLM release aiconfigurator measured `folder` under on `system` (its own measurement, not a
    table it reuses from an older release)."""
    listing = subprocess.run(["git", f"--git-dir={git}", "ls-tree", "-r", "--name-only", "HEAD",
                              f"{AIC_DATA}/{system}/{folder}/vllm/"], check=True, capture_output=True,
                             text=True).stdout.split()
    versions = [p.split("/")[-2] for p in listing if p.endswith("/collection_meta.yaml")]
    return max(versions, key=lambda v: tuple(int(x) if x.isdigit() else -1 for x in v.split(".")), default=None)


def aic_table(git: str, system: str, table: str) -> tuple[str, list[dict[str, object]]] | None:
    import pyarrow as pa  # (only this script reads parquet)
    import pyarrow.parquet as pq

    folder, name = AIC_TABLES[table]
    version = aic_version(git, system, folder)
    if version is None:
        return None
    data = subprocess.run(["git", f"--git-dir={git}", "show", f"HEAD:{AIC_DATA}/{system}/{folder}/vllm/{version}/"
                           f"{name}.parquet"], check=True, capture_output=True).stdout
    return version, pq.read_table(pa.BufferReader(data)).to_pylist()


def aic_rows(git: str, system: str) -> tuple[list[dict[str, object]], dict[str, str]]:
    """The rows of `system`'s tables, and the vLLM release each table was measured under. A system in AIC_ONLY
    takes its 16-bit rows of the tables named there only, and every GPU its quantized GEMM and MoE rows."""
    out, versions = [], {}
    for table, parse in AIC_PARSE.items():
        only = system in AIC_ONLY and not any(t in AIC_ONLY[system] for t in (table, AIC_TABLES[table][0]))
        if only and table not in ("gemm", "moe"):
            continue
        got = aic_table(git, system, table)
        if got is None:
            continue
        rows = [] if only else parse(got[1])
        if rows:
            versions[table] = got[0]
            out.extend(thinned(rows, AIC_MOST[table]))
        if table in ("gemm", "moe"):
            for dtype in QUANT_BYTES:
                quantized = (aic_gemm if table == "gemm" else aic_moe)(got[1], dtype)
                if quantized:
                    versions[quant_op(table, dtype)] = got[0]
                    out.extend(thinned(quantized, AIC_MOST[table]))
    return out, versions


def main(llmservingsim: str, vidur: str, aiconfigurator: str) -> None:
    files: dict[str, list[dict[str, object]]] = {}
    for gpu, model, folder, tps in V1:
        for tp in tps:
            files.setdefault(gpu, []).extend(v1_rows(llmservingsim, model, folder, tp))
    for gpu, model, folder, tps in V0:
        for tp in tps:
            files.setdefault(gpu, []).extend(v0_rows(llmservingsim, model, folder, tp))
    files["h100-sxm"].extend(custom_all_reduce() + vidur_all_reduce(vidur))
    for system, gpu in AIC:
        rows, versions = aic_rows(aiconfigurator, system)
        files.setdefault(gpu, []).extend(rows)
        print(f"{gpu}: aiconfigurator {system}, vLLM {versions}")
    OUT.mkdir(parents=True, exist_ok=True)
    for gpu, rows in files.items():
        with open(OUT / f"{gpu}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, FIELDS, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        print(f"{gpu}: {len(rows)} measurements")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3])
