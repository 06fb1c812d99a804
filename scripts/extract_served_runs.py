"""Collect public end-to-end vLLM serving runs that kvbudget's step times are validated on (never fitted on).

Usage: python scripts/extract_served_runs.py TRAINING_GIT LLMSERVINGSIM_GIT DENNISLEE_GIT GPUSTACK_GIT

TRAINING_GIT: the git directory of github:inference-sim/training (16 vLLM 0.15.1 runs on H100 with
inference-perf; their settings and measured latencies, as facts with the source named: the repository states no
licence). LLMSERVINGSIM_GIT: github:casys-kaist/LLMServingSim (MIT): its vLLM 0.19 bench runs, copied whole
(per-request arrivals, lengths and timestamps). DENNISLEE_GIT: github:dennislee22/vLLM-benchmarking (no licence
stated: figures and settings only): vLLM 0.10.1.1 serving Qwen2-7B-Instruct on A100s, `benchmark_serving.py` blocks
pasted in its README beside the start-up logs in log/. GPUSTACK_GIT: github:gpustack/gpustack (Apache-2.0): its
performance lab's baseline runs (`vllm serve MODEL` with the release's defaults, `vllm bench serve` on random
prompts of fixed length, every request at once), docs/performance-lab/<model>/<gpu>.md. Every run is marked
`"split": "validate"`: none is fitted on.
Writes benchmarks/data/served/.
"""

from __future__ import annotations

import json
import re
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
                     "source": f"github:inference-sim/training {folder} @{rev[:7]}",
                     "licence": "figures only (the repository states no licence)"})
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
                     "source": f"github:casys-kaist/LLMServingSim {folder}/vllm @{rev[:7]} (MIT)",
                     "licence": "MIT, Copyright (c) 2024 CASYS Lab at KAIST"})
    return runs


# dennislee22/vLLM-benchmarking's README sections ("Test N") of Qwen2-7B-Instruct, each with its start-up log (vLLM
# 0.10.1.1; max_model_len 16384, chunked prefill at 2048 tokens, prefix caching on, all in the log's config line):
# (GPU, tensor parallel size, nodes, log). Tests 6-9 (Qwen2.5-32B, Qwen2-72B, gpt-oss-120b) publish no start-up log
# and are left out (README.md says why).
DENNISLEE = {1: ("A100-40GB", 2, 2, "log/vllm-7B-2gpuA10040GB-0.5GRAM-diff-nodes.log"),
             2: ("A100-80GB", 2, 1, "log/vllm-7B-2gpuA10080GB-0.25GRAM-same-node.log"),
             3: ("A100-80GB", 2, 1, "log/vllm-7B-2gpuA10080GB-0.5GRAM-same-node.log"),
             4: ("A100-80GB", 1, 1, "log/vllm-7B-1gpuA10080GB-0.25GRAM.log"),
             5: ("A100-80GB", 1, 1, "log/vllm-7B-1gpuA10080GB-0.5GRAM.log")}
# what linked a test's GPUs, from vLLM's warning in its start-up log that it turned its custom all-reduce off
# (vllm/distributed/device_communicators/custom_all_reduce.py): without peer-to-peer access NCCL goes through host
# memory; across nodes over the network. Test 1's log names no NCCL transport: its two workers are Kubernetes pods
# reaching each other at pod addresses (10.254.x.x) through Ray, with no InfiniBand device in sight, so NCCL's TCP
# sockets over Ethernet are assumed (and said so in the run).
LINK_EVIDENCE = (("your platform lacks GPU", "pcie-no-p2p"), ("this process group spans across nodes", "ethernet"))
ACROSS_NODES_ASSUMED = ("the log names no NCCL transport; the workers are Kubernetes pods reaching each other at pod "
                        "addresses (10.254.x.x) through Ray, no InfiniBand device named: NCCL's TCP sockets over "
                        "Ethernet assumed")


def link_of(text: str, log: str, tp: int) -> dict[str, str]:
    """A multi-GPU run's link and the first log line that shows it (`FILE:LINE QUOTE`); nothing for one GPU."""
    if tp == 1:
        return {}
    for number, line in enumerate(text.splitlines(), 1):
        for phrase, link in LINK_EVIDENCE:
            if phrase in line:
                quote = (line[line.find("[custom_all_reduce"):] if "[custom_all_reduce" in line else line).strip()
                found = {"interconnect": link, "interconnect_evidence": f"{log}:{number} {quote}"}
                return found | ({"interconnect_assumed": ACROSS_NODES_ASSUMED} if link == "ethernet" else {})
    raise ValueError(f"{log}: no line says how the {tp} GPUs were linked")


# the printed block of benchmark_serving.py / vllm bench serve: label -> (metric, statistic); milliseconds
BLOCK = {"Mean TTFT": ("ttft_s", "mean"), "Median TTFT": ("ttft_s", "p50"), "P99 TTFT": ("ttft_s", "p99"),
         "Mean TPOT": ("tpot_s", "mean"), "Median TPOT": ("tpot_s", "p50"), "P99 TPOT": ("tpot_s", "p99"),
         "Mean ITL": ("itl_s", "mean"), "Median ITL": ("itl_s", "p50"), "P99 ITL": ("itl_s", "p99"),
         "Mean E2EL": ("e2e_s", "mean"), "Median E2EL": ("e2e_s", "p50"), "P99 E2EL": ("e2e_s", "p99")}


def bench_block(text: str) -> dict:
    """The figures of one printed "Serving Benchmark Result" block: request and token counts, latencies in
    seconds."""
    lines = dict(re.findall(r"^([^:\n]+):\s+([\d.]+)\s*$", text, re.M))
    measured: dict[str, dict[str, float]] = {}
    for label, (metric, stat) in BLOCK.items():
        if f"{label} (ms)" in lines:
            measured.setdefault(metric, {})[stat] = round(float(lines[f"{label} (ms)"]) / 1e3, 8)
    return {"requests": int(lines["Successful requests"]), "duration_s": float(lines["Benchmark duration (s)"]),
            "input_tokens": int(lines["Total input tokens"]), "output_tokens": int(lines["Total generated tokens"]),
            "measured": measured}


# the engine's statistics line vLLM 0.10's server logs every 10 seconds (v1/metrics/loggers.py LoggingStatLogger)
ENGINE_LOG = re.compile(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) \[loggers\.py:\d+\] Engine \d+: Avg prompt throughput: "
                        r"([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs, "
                        r"Waiting: (\d+) reqs, GPU KV cache usage: ([\d.]+)%")


def engine_log(text: str) -> list[dict]:
    """The engine's statistics lines pasted after a block (each whole line; a line cut at its start is skipped):
    when, the prompt and generation throughput of the 10 seconds before it, the sequences running and waiting
    then, and the share of the KV pool in use."""
    return [{"at": at, "prompt_tokens_per_s": float(prompt), "generation_tokens_per_s": float(generation),
             "running": int(running), "waiting": int(waiting), "kv_usage": round(float(usage) / 100, 6)}
            for at, prompt, generation, running, waiting, usage in ENGINE_LOG.findall(text)]


def server_of(text: str) -> dict[str, int]:
    """The API server's process id in the log lines pasted after a block (a run's server: runs on one server share
    its prefix cache, and the random dataset's prompts repeat from run to run); nothing where no line names one."""
    found = re.search(r"\(APIServer pid=(\d+)\)", text)
    return {"server_pid": int(found.group(1))} if found else {}


def dennislee(git: str) -> list[dict]:
    runs, rev = [], commit(git)
    readme = show(git, "README.md")
    for section in re.split(r"\n#+ <a name=\"toc_\d+\"></a>\S+ Test ", readme)[1:]:
        test = int(section.split(":")[0])
        if test not in DENNISLEE:
            continue
        gpu, tp, nodes, log = DENNISLEE[test]
        text = show(git, log)
        tokens = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", text).group(1).replace(",", ""))
        (batched,) = set(re.findall(r"max_num_batched_tokens=(\d+)", text))
        found = list(re.finditer(r"```\n(python[^\n]*benchmark_serving\.py.*?)\n\n=+ Serving Benchmark Result =+\n"
                                 r"(.*?)\n=+\n", section, re.S))
        for k, match in enumerate(found):
            command, block = match.groups()
            # the engine's log lines pasted after the block, up to the next command
            after = section[match.end():found[k + 1].start() if k + 1 < len(found) else len(section)]
            flags = dict(re.findall(r"--([\w-]+)[= ]([^\s\\]+)", command))
            assert flags["dataset-name"] == "random" and "random-range-ratio" not in flags, command
            figures = bench_block(block)
            runs.append({"id": f"a100-qwen2-7b-test{test}-{k + 1:02d}", "gpu": gpu, "model": "qwen2-7b", "tp": tp,
                         "nodes": nodes, "engine": "vLLM 0.10.1.1", "max_model_len": 16384,
                         "max_num_batched_tokens": int(batched),
                         # 0.10's server default on an A100 (releases.BATCH_DEFAULTS: the small tier)
                         "max_num_seqs": 256, "num_gpu_blocks": tokens // 16, "prefix_caching": True,
                         # benchmark_serving.py's random dataset: fixed lengths (range ratio 0), every request
                         # sent at once (request rate inf, no concurrency limit); outputs may stop at EOS (no
                         # --ignore-eos), so the mean lengths are the block's totals over its requests
                         "load": {"dataset": "random", "input_len": int(flags["random-input-len"]),
                                  "output_len": int(flags["random-output-len"]),
                                  "num_prompts": int(flags["num-prompts"]), "request_rate": None,
                                  "max_concurrency": None},
                         **figures, "failed": int(flags["num-prompts"]) - figures["requests"],
                         "engine_log": engine_log(after), **server_of(after), **link_of(text, log, tp),
                         "source": f"github:dennislee22/vLLM-benchmarking README.md (Test {test}, block {k + 1}) "
                                   f"and {log} @{rev[:7]}",
                         "licence": "figures only (the repository states no licence)"})
    return runs


# gpustack's performance lab: page -> (GPU, model); the tensor parallel size is the baseline command's -tp. Its
# pages on H100 (a GPU whose kernels were measured) and those whose model or baseline command kvbudget cannot take
# as stated (GLM-4.5-Air, GLM-5.2; Qwen3-235B-A22B and the pages without a plain baseline command) are left out.
GPUSTACK = {"qwen3-14b/a100": ("A100-80GB", "qwen3-14b"), "qwen3-32b/a100": ("A100-80GB", "qwen3-32b"),
            "gpt-oss-20b/a100": ("A100-80GB", "gpt-oss-20b"), "deepseek-r1/h200": ("H200", "deepseek-r1"),
            "glm-4.x/h200": ("H200", "glm-4.6")}
# vllm serve's (max_num_batched_tokens, max_num_seqs) in 0.11 by GPU (kvbudget's releases.BATCH_DEFAULTS: A100s in
# the small tier whatever their memory, the H200's 141 GB in the large one; the huge tier only from 0.28)
SERVE_DEFAULTS = {"A100-80GB": (2048, 256), "H200": (8192, 1024)}


def gpustack(git: str) -> list[dict]:
    runs, rev = [], commit(git)
    for page, (gpu, model) in GPUSTACK.items():
        path = f"docs/performance-lab/{page}.md"
        text = show(git, path)
        version = re.search(r"- vLLM:? v([\d.]+)", text).group(1)
        lengths = {int(i): int(o) for i, o in re.findall(r"prompt: (\d+) input tokens, (\d+) output tokens", text)}
        base = text.split('??? info "Baseline serving script"')[1]
        command = re.search(r"```bash\n\s*(vllm serve [^\n]*)\n", base).group(1)
        assert re.fullmatch(r"vllm serve \S+( -tp \d+)?", command), command
        tp = int(re.search(r"-tp (\d+)", command).group(1)) if "-tp" in command else 1
        results = base.split('??? info "Baseline benchmark results"')[1].split("```")[1]
        batched, seqs = SERVE_DEFAULTS[gpu]
        for label, block in re.findall(r"# random (\w+) input\n\s*=+ Serving Benchmark Result =+\n(.*?)\n\s*=+\n",
                                       results, re.S):
            asked = int(label[:-1]) * 1000 if label.endswith("K") else int(label)
            figures = bench_block(re.sub(r"(?m)^\s+", "", block))
            runs.append({"id": f"gpustack-{page.replace('/', '-')}-random-{label.lower()}", "gpu": gpu,
                         "model": model, "tp": tp, "nodes": 1, "engine": f"vLLM {version}",
                         "max_model_len": None, "max_num_batched_tokens": batched, "max_num_seqs": seqs,
                         "num_gpu_blocks": None, "prefix_caching": True,
                         "load": {"dataset": "random", "input_len": asked, "output_len": lengths[asked],
                                  "num_prompts": figures["requests"], "request_rate": None, "max_concurrency": None},
                         # (0.11's block prints the successes only; each is the round count the page sends)
                         **figures, "failed": 0,
                         "source": f"github:gpustack/gpustack {path} (baseline: {command}) @{rev[:7]}",
                         "licence": "Apache-2.0 (the repository's LICENSE)"})
    return runs


def main(training: str, servingsim: str, dennislee_git: str, gpustack_git: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    every = llmservingsim(servingsim) + inference_sim(training) + dennislee(dennislee_git) + gpustack(gpustack_git)
    runs = {"about": "Public end-to-end vLLM runs kvbudget's step times are checked against and never fitted on "
                     "(benchmarks/served.py); each is marked split: validate. README.md names the sources.",
            "runs": [{**run, "split": "validate"} for run in every]}
    (OUT / "runs.json").write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    print(f"{len(runs['runs'])} runs")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
