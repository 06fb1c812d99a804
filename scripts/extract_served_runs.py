"""Collect public end-to-end vLLM serving runs that kvbudget's step times are validated on (never fitted on).

Usage: python scripts/extract_served_runs.py TRAINING_GIT LLMSERVINGSIM_GIT

TRAINING_GIT: the git directory of github:inference-sim/training (16 vLLM 0.15.1 runs on H100 with
inference-perf; their settings and measured latencies, as facts with the source named: the repository states no
licence). LLMSERVINGSIM_GIT: github:casys-kaist/LLMServingSim (MIT): its vLLM 0.19 bench runs, copied whole
(per-request arrivals, lengths and timestamps). Writes benchmarks/data/served/.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "served"
MODELS = {"meta-llama/Llama-2-7b-hf": "llama-2-7b", "meta-llama/Llama-2-70b-hf": "llama-2-70b",
          "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b", "codellama/CodeLlama-34b-Instruct-hf": "codellama-34b",
          "meta-llama/Llama-3.1-8B": "llama-3.1-8b", "Qwen/Qwen3-32B": "qwen3-32b"}
QUANTILES = ("min", "p1", "p5", "p10", "p25", "median", "p75", "p90", "p95", "p99", "max")
BENCH = [("RTX-4090", "bench/examples/RTX4090/Llama-3.1-8B"),
         ("RTX-PRO-6000", "bench/examples/RTXPRO6000/Llama-3.1-8B"),
         ("RTX-PRO-6000", "bench/examples/RTXPRO6000/Qwen3-32B")]


def show(git: str, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={git}", "show", f"HEAD:{path}"], check=True, capture_output=True,
                          text=True).stdout


def commit(git: str) -> str:
    return subprocess.run(["git", f"--git-dir={git}", "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def metric(block: dict) -> dict[str, float]:
    return {"mean": block["mean"], "p50": block["median"], "p90": block["p90"]}


def inference_sim(git: str) -> list[dict]:
    runs, rev = [], commit(git)
    listing = subprocess.run(["git", f"--git-dir={git}", "ls-tree", "--name-only", "HEAD", "default_args/"],
                             check=True, capture_output=True, text=True).stdout.split()
    for folder in listing:
        exp = yaml.safe_load(show(git, f"{folder}/exp-config.yaml"))
        profile = json.loads(show(git, f"{folder}/profile.yaml"))
        stages = []
        for i, stage in enumerate(profile["load"]["stages"]):
            m = json.loads(show(git, f"{folder}/results/stage_{i}_lifecycle_metrics.json"))
            ok = m["successes"]
            stages.append({"rate": stage["rate"], "duration_s": stage["duration"],
                           "prompt_tokens": {q: ok["prompt_len"][q] for q in QUANTILES},
                           "requests": ok["count"] + m["failures"]["count"], "failed": m["failures"]["count"],
                           "measured": {"ttft_s": metric(ok["latency"]["time_to_first_token"]),
                                        "e2e_s": metric(ok["latency"]["request_latency"]),
                                        "output_tokens_per_s": ok["throughput"]["output_tokens_per_sec"]}})
        runs.append({"id": folder.split("/")[-1], "gpu": "H100-80GB", "model": MODELS[exp["model"]],
                     "tp": exp["tensor_parallelism"], "engine": "vLLM 0.15.1",
                     "max_model_len": exp["max_model_len"], "max_num_batched_tokens": exp["max_num_batched_tokens"],
                     "max_num_seqs": exp["max_num_seqs"], "prefix_caching": True,
                     "output_tokens": profile["data"]["shared_prefix"]["output_len"],
                     # inference-perf's shared-prefix data with multi-turn chat: this many prompts, fixed in advance
                     # (a system prompt and a question each), sent in turn (datagen/shared_prefix_datagen.py)
                     "distinct_prompts": profile["data"]["shared_prefix"]["num_unique_system_prompts"]
                     * profile["data"]["shared_prefix"]["num_users_per_system_prompt"],
                     "arrivals": profile["load"]["type"], "stages": stages,
                     "source": f"github:inference-sim/training {folder} @{rev[:7]}"})
    return runs


def llmservingsim(git: str) -> list[dict]:
    runs, rev = [], commit(git)
    for gpu, folder in BENCH:
        meta = json.loads(show(git, f"{folder}/vllm/meta.json"))
        name = f"{gpu.lower()}-{MODELS[meta['model']]}"
        (OUT / f"{name}.requests.jsonl").write_text(show(git, f"{folder}/vllm/requests.jsonl"), encoding="utf-8")
        kw = meta["engine_kwargs"]
        kv = meta.get("kv_cache") or {}
        runs.append({"id": name, "gpu": gpu, "model": MODELS[meta["model"]], "tp": kw["tensor_parallel_size"],
                     "engine": f"vLLM {meta['vllm_version']}", "max_model_len": kw["max_model_len"],
                     "max_num_batched_tokens": kw["max_num_batched_tokens"], "max_num_seqs": kw["max_num_seqs"],
                     "num_gpu_blocks": kv.get("num_gpu_blocks"), "prefix_caching": True,
                     "requests_file": f"{name}.requests.jsonl",
                     "source": f"github:casys-kaist/LLMServingSim {folder}/vllm @{rev[:7]} (MIT)"})
    return runs


def main(training: str, servingsim: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    runs = {"about": "Public end-to-end vLLM runs kvbudget's step times are checked against and never fitted on "
                     "(benchmarks/bench_step_times.py). README.md names the sources.",
            "runs": llmservingsim(servingsim) + inference_sim(training)}
    (OUT / "runs.json").write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    print(f"{len(runs['runs'])} runs")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
