"""Collect aiconfigurator's silicon runs that kvbudget can replay: held-out end-to-end vLLM measurements (never
fitted on).

Usage: python scripts/extract_silicon_runs.py [AICONFIGURATOR_GIT | silicon_sample.csv]

NVIDIA's aiconfigurator (github:ai-dynamo/aiconfigurator, Apache-2.0) ships
`aic-core/src/aiconfigurator_core/systems/silicon_sample.csv`: end-to-end serving measurements (mean TTFT and mean
TPOT) of vLLM, SGLang and TRT-LLM on H100, H200, B200, B300, GB200 and GB300, with model, precision, ISL/OSL,
concurrency, parallelism and release. This keeps the rows kvbudget's `simulate` can replay (`select`: vLLM,
aggregated serving, a model and GPU in kvbudget's catalog, tensor parallelism only) and writes
benchmarks/data/served/silicon.json, each row marked `"split": "validate"` with its source and licence. kvbudget
fits its step times only on per-kernel tables (src/kvbudget/data/steptimes/), none of these runs.
Default source: the local mirror of the repository (a bare git directory).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from extract_served_runs import commit, show  # (scripts/ is on the path when a script runs)

OUT = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "served" / "silicon.json"
MIRROR = "/work/.mirror/ai-dynamo+aiconfigurator/repo"
REPO = "github:ai-dynamo/aiconfigurator"
CSV_PATH = "aic-core/src/aiconfigurator_core/systems/silicon_sample.csv"
LICENCE = "Apache-2.0 (aiconfigurator's LICENSE), Copyright (c) NVIDIA CORPORATION & AFFILIATES"

# Hugging Face ids of the runs -> kvbudget's catalog names. MiniMax-M2.5's config.json (aiconfigurator's
# model_configs/MiniMaxAI--MiniMax-M2.5_config.json) has minimax-m2's architecture key for key (62 layers, 48 query
# and 8 KV heads of 128, 256 experts of 1,536, 8 per token, 3 MTP modules); Kimi-K2.5's text_config has kimi-k2's
# (61 layers, MLA, 384 experts, 8 per token), its YaRN factor (64, not 32) and 262,144 positions apart, which change
# neither the KV cache per token nor a step's work; its vision tower is not run by text prompts.
MODELS = {"Qwen/Qwen3-32B": "qwen3-32b", "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
          "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b", "openai/gpt-oss-120b": "gpt-oss-120b",
          "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b", "MiniMaxAI/MiniMax-M2.5": "minimax-m2",
          "moonshotai/Kimi-K2.5": "kimi-k2"}
# aiconfigurator's system names -> kvbudget's catalog (src/kvbudget/data/gpus.json)
GPUS = {"h100_sxm": "H100-80GB", "h200_sxm": "H200", "b200_sxm": "B200", "b300_sxm": "B300", "gb200": "GB200"}
# the weights as the CSV's precision and checkpoint name them -> kvbudget's spelling (served.py's WEIGHTS):
# gpt-oss's own checkpoint is MXFP4 experts (aiconfigurator files it under fp4 / nvfp4); Kimi-K2.5's is
# compressed-tensors int4 experts (aiconfigurator: int4_wo); fp4 elsewhere is NVFP4
WEIGHTS = {"": "bf16", "fp8": "fp8", "int4": "int4", "fp4": "nvfp4"}
NATIVE_FP4 = {"openai/gpt-oss-120b": "mxfp4"}

ABOUT = ("aiconfigurator's silicon runs that kvbudget can replay (scripts/extract_silicon_runs.py): vLLM serving "
         "one model on one node with tensor parallelism only, measured end to end at a fixed concurrency. Held "
         "out: every row is split validate, none is fitted on (kvbudget fits per-kernel tables only, "
         "src/kvbudget/data/steptimes/). How they were run (aiconfigurator's benchmark templates, "
         "src/aiconfigurator/generator/config/backend_templates/benchmark/bench_run.sh.j2 and generator/sflow.py; "
         "the CSV itself records only the image, the release and the concurrency): the client is aiperf "
         "(`aiperf profile`, aiperf 0.3.0 in sflow.py) on the chat endpoint with streaming, synthetic prompts of "
         "exactly ISL tokens and outputs of exactly OSL tokens (--isl-stddev 0 --osl-stddev 0, ignore_eos), "
         "--concurrency N closed-loop clients, N x 20 requests measured (MULTI_ROUND 20) after a warm-up of 2N "
         "(N in sflow.py), random seed 100; TTFT and TPOT are aiperf's averages over the measured requests "
         "(silicon_ttft_ms, silicon_tpot_ms: means). The engine's arguments are not recorded; aiconfigurator's "
         "generator (rule_plugin/benchmark/vllm.rule) deploys aggregated vLLM with max_num_seqs = the batch size "
         "(the concurrency here), max_num_batched_tokens = batch + ISL + 1500 and max_model_len = ISL + OSL + "
         "1500, which the replay assumes. The KV cache dtype is not recorded either: vLLM's default (auto) is "
         "assumed. Times in seconds.")


def release(row: dict[str, str]) -> str | None:
    """The vLLM release as the CSV's backend_version names it (a nightly keeps its tag, nightly-<commit>); None where
    it names none (the 249 rows of 2026-04-06.csv, whose provenance records no image either)."""
    return row["backend_version"] or None


def weights(row: dict[str, str]) -> str:
    if row["precision"] == "fp4" and row["model_path"] in NATIVE_FP4:
        return NATIVE_FP4[row["model_path"]]
    return WEIGHTS[row["precision"]]


# each filter in the order applied: (what a row must be, its test)
FILTERS = (
    ("vLLM", lambda r: r["backend"] == "vllm"),
    ("aggregated serving (disaggregated prefill/decode is not simulated)", lambda r: r["mode"] == "agg"),
    ("a concurrency recorded", lambda r: r["batch_size"].isdigit()),
    ("a model in kvbudget's catalog", lambda r: r["model_path"] in MODELS),
    ("a GPU in kvbudget's catalog", lambda r: r["system"] in GPUS),
    ("attention data parallel 1 (simulate runs tensor parallelism only)",
     lambda r: r["attention_dp_size"] in ("", "1")),
    ("expert parallel 1 (simulate runs tensor parallelism only)", lambda r: r["moe_ep_size"] == "1"),
    ("pipeline parallel 1", lambda r: r["pp_size"] == "1"),
)


def select(rows: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, int]]:
    """The rows every filter keeps, and how many rows each filter dropped (in the order applied)."""
    dropped: dict[str, int] = {}
    for what, keep in FILTERS:
        dropped[what] = sum(not keep(r) for r in rows)
        rows = [r for r in rows if keep(r)]
    return rows, dropped


def run_of(row: dict[str, str], source: dict[str, str]) -> dict[str, Any]:
    """One silicon.json row."""
    return {"id": row["id"], "gpu": GPUS[row["system"]], "model": MODELS[row["model_path"]],
            "hf_model": row["model_path"], "weights": weights(row), "kv_dtype": "auto", "tp": int(row["tp_size"]),
            "release": release(row), "isl": int(row["isl"]), "osl": int(row["osl"]),
            "concurrency": int(row["batch_size"]),
            "measured": {"ttft_s": float(row["silicon_ttft_ms"]) / 1e3, "tpot_s": float(row["silicon_tpot_ms"]) / 1e3},
            "provenance": row["silicon_data_source"], "split": "validate", "source": source, "licence": LICENCE}


def extract(text: str, source: dict[str, str]) -> dict[str, Any]:
    rows = list(csv.DictReader(io.StringIO(text)))
    kept, dropped = select(rows)
    vllm = [r for r in rows if r["backend"] == "vllm" and r["mode"] == "agg"]
    return {"about": ABOUT, "source": source, "licence": LICENCE, "rows_read": len(rows),
            "dropped": dropped,
            "not_mapped": sorted({r["model_path"] for r in vllm if r["model_path"] not in MODELS}
                                 | {r["system"] for r in vllm if r["system"] not in GPUS}),
            "weights": dict(Counter(weights(r) for r in kept)),
            "runs": [run_of(r, source) for r in kept]}


def main(where: str = MIRROR) -> None:
    if where.endswith(".csv"):
        text, source = Path(where).read_text(encoding="utf-8"), {"repo": REPO, "path": CSV_PATH, "commit": "unknown"}
    else:
        text, source = show(where, CSV_PATH), {"repo": REPO, "path": CSV_PATH, "commit": commit(where)}
    data = extract(text, source)
    runs = data.pop("runs")
    head = json.dumps(data, indent=1)[:-2]  # one run a line: the file stays readable in a diff
    OUT.write_text(head + ',\n "runs": [\n' + ",\n".join(json.dumps(r) for r in runs) + "\n ]\n}\n",
                   encoding="utf-8")
    print(f"{len(runs)} of {data['rows_read']} rows kept; dropped: "
          + "; ".join(f"not {what}: {n}" for what, n in data["dropped"].items()))


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])
