"""Write benchmarks/data/fleet/published.json: published fleet results with their inputs, for
benchmarks/fleet_published.py. Validation data: nothing is fitted on it.

Usage: python scripts/extract_fleet_published.py KV_CACHE_MANAGER_GIT

KV_CACHE_MANAGER_GIT: the git directory of github:llm-d/llm-d-kv-cache-manager (Apache-2.0) at a378f5b: the
per-stage tables of benchmarking/73-capacity/README.md and benchmarking/37-capacity/README.md are read from it
number for number. The rest (the DistServe blog's figures, the settings read from DistServe's and
inference-perf's sources) is written below with the file and commit each comes from.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "fleet" / "published.json"
COMMIT = "a378f5b38f62c746388997cbba1da706a237ec42"


def tables(git: str, path: str) -> dict:
    """A report's 'Summary across QPS' and 'QPS = N' tables: experiment -> metric -> number."""
    text = subprocess.run(["git", "-C", git, "show", f"{COMMIT}:{path}"], capture_output=True, text=True,
                          check=True).stdout
    out: dict = {}
    section = None
    for line in text.splitlines():
        m = re.match(r"### (Summary across QPS|QPS = ([\d.]+))", line)
        if m:
            section = "summary" if m.group(2) is None else str(float(m.group(2)))
            continue
        if section is not None and line.startswith("| ") and not line.startswith("| Experiment") and "---" not in line:
            cells = [c.strip() for c in line.strip("|").split("|")]
            if "/" in cells[1]:
                continue  # the queue and KV-usage summary table
            nums = cells[1:]
            head = ["output_tokens_per_s", "requests_per_s"] + (["success_rate"] if len(nums) == 7 else []) + [
                "ttft_p90_s", "ttft_mean_s", "itl_mean_s"]
            out.setdefault(section, {})[cells[0]] = {
                h: float(v.rstrip("%")) / (100 if v.endswith("%") else 1) for h, v in zip(head, nums, strict=False)}
    return out


KVM = {"repository": "llm-d/llm-d-kv-cache-manager", "commit": COMMIT}
METRICS = {
    "output_tokens_per_s":
        "inference-perf (5b1da4d, reportgen/base.py summarize_requests): the output tokens the client counted over "
        "the requests of the stage, over the time from the first request's start to the last one's end; the summary "
        "row over all stages",
    "requests_per_s": "inference-perf: successful requests over the same time",
    "success_rate": "requests answered without error",
    "ttft_p90_s":
        "inference-perf: 90th percentile of the first streamed token's time less the request's start, seconds "
        "(numpy's linear percentile)",
    "ttft_mean_s": "the mean of the same, seconds",
    "itl_mean_s":
        "inference-perf: the mean gap between successive streamed chunks' times over every request, seconds (p50 0 "
        "in the tables: several tokens arrive in one chunk, so the mean is the decode time over the tokens)"}
CAVEAT = (
    "requests_per_s is close to the offered rate in every stage, so the time it divides by is about the stage's "
    "sending time, not until the last of 1,000 output tokens "
          "streamed after TTFTs of up to 100 s: the throughput columns' time base (or the output tokens counted) "
              "cannot be what summarize_requests computes for these requests; "
          "the simulation's output_tokens_per_s follows summarize_requests and is not comparable to the "
              "published column; TTFT and ITL are")

def stages(table: dict) -> list:
    return [{"rate": float(k), "figures": v} for k, v in table.items() if k != "summary"]

def prefix_result(id_, title, table, *, path, model, tp, replicas, kv_tokens, workload, strategies, also=(), note):
    return {
        "id": id_, "title": title, "split": "validate",
        "source": {**KVM, "path": path, "url": f"https://github.com/llm-d/llm-d-kv-cache-manager/blob/{KVM['commit']}/{path}",
                   "where":
                       "'Workload profile', 'Scheduler Configurations', 'Summary across QPS' and 'Per-QPS Results' "
                       "(tables copied number for number)"},
        "also": list(also),
        "licence": "Apache-2.0 (llm-d/llm-d-kv-cache-manager's LICENSE)",
        "deployment": {"engine": "vllm", "model": model, "gpu": "H100-80GB", "tp": tp, "replicas": replicas,
                       "kv_tokens_per_replica": kv_tokens, "block_size": 64},
        "workload": workload,
        "strategies": strategies,
        "published": {"metrics": METRICS, "summary": table["summary"], "stages": stages(table)},
        "assumed": [
            "the vLLM release and its scheduler settings are not stated: the simulator's newest vLLM policy with "
                "its server defaults (max_num_seqs, max_num_batched_tokens, chunked prefill, prefix caching on)",
            "block_size 64 for every strategy: the precise scorer's tokenProcessorConfig.blockSize is 64 and the "
                "llm-d guide says it must match vLLM's --block-size; the same pods serve every strategy",
            "the KV pool is the README's 'KV/pod' in tokens (kv_tokens_per_replica / block_size blocks); the "
                "GPU's memory plan is not used",
            "the prompts are inference-perf's shared_prefix prompts as its generator made them in September 2025 "
                "(5b1da4d): num_groups x num_prompts_per_group fixed prompts (system prompt of the group + a "
                "question of its own), shuffled once and sent in that order round and round, so a prompt repeats "
                "whole every groups x prompts requests; the shuffle is seeded here (seed 0), the real one was not",
            "prompt lengths are exact (system_prompt_len + question_len tokens; the real prompts are random "
                "token ids decoded and encoded again, so within a few tokens)",
            "inference-perf sends int(rate x duration) requests a stage and waits for every answer before the "
                "next stage starts; the simulation starts each stage after the last one drained (idle time between "
                "stages changes no state: a replica keeps its prefix cache while idle)",
            "no client-side cap on requests in flight (inference-perf's default is 100 per load-generator "
                "worker, one worker per CPU of its pod: not stated)",
            "random-scheduling: a uniform random pick per request (seeded); load-scheduling: GIE's queue-scorer "
                "((max - q) / (max - min) of the waiting queues, 1 when all equal) plus kv-cache-scorer (1 - KV "
                "usage), weights 1 and 1, max-score-picker with ties broken at random, both read from the engines' "
                "gauges scraped every 50 ms (GIE's default metrics refresh)",
            "the time model is kvbudget's default for the GPU, no calibration; the network and gateway add nothing",
        ],
        "note": note + "; " + CAVEAT,
    }

inference_perf = {"repository": "kubernetes-sigs/inference-perf", "commit": "5b1da4dabc49e8ab5df9059cb0d19ae052a2c794",
                  "paths": ["inference_perf/datagen/shared_prefix_datagen.py",
                            "inference_perf/loadgen/load_generator.py", "inference_perf/loadgen/load_timer.py"],
                  "licence": "Apache-2.0",
                  "what":
                      "how the load generator made the prompts, timed the arrivals and ran the stages, read from its "
                      "source"}

def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    t73 = tables(sys.argv[1], "benchmarking/73-capacity/README.md")
    t37 = tables(sys.argv[1], "benchmarking/37-capacity/README.md")
    r73 = prefix_result(
        "llm-d-precise-prefix-73",
            "llm-d: precise prefix-cache aware scheduling vs approximate, load-aware and random (8 x Qwen3-32B TP 2 "
            "on H100, shared prefixes at 73% of the fleet's KV)",
        t73, path="benchmarking/73-capacity/README.md", model="qwen3-32b", tp=2, replicas=8, kv_tokens=307328,
        workload={"kind": "shared-prefix", "groups": 150, "prompts_per_group": 5, "system_prompt_tokens": 6000,
                  "question_tokens": 1200, "output_tokens": 1000, "ignore_eos": True, "arrivals": "poisson",
                  "stages": [{"rate": 15, "duration_s": 50, "warmup": True}] + [
                      {"rate": r, "duration_s": d} for r, d in (
                          (3, 20), (10, 20), (15, 20), (20, 38), (22, 34), (25, 30), (30, 25), (35, 21), (40, 38),
                          (43, 36), (46, 33), (49, 30), (52, 29), (55, 27), (57, 26), (60, 25))],
                  "load_generator": inference_perf},
        strategies={
            "random-scheduling": {"router": "random"},
            "load-scheduling": {"router": "scored", "weights": {"queue": 1.0, "kv-cache": 1.0}},
            "estimated-scheduling": {"router": "prefix-approx", "block": 64, "entries": 31250,
                                     "weights": {"prefix": 1.0, "kv-cache": 1.0, "queue": 1.0}, "scorer":
                "GIE's prefix-cache-scorer from routing history: hashBlockSize 64, maxPrefixBlocksToMatch 256, "
                "lruCapacityPerServer 31250"},
            "precise-scheduling": {"router": "prefix", "weights": {"prefix": 3.0, "kv-cache": 2.0, "queue": 2.0},
                                   "scorer": "llm-d's prefix-cache-scorer in cache_tracking mode from vLLM's KV "
                                   "events, blockSize 64"},
        },
        also=[{"repository": "llm-d/llm-d.github.io", "path": "blog/2025-09-24_kvcache-wins-you-can-see.md",
               "commit": "049167ed10a34fa1e01c0680274254ea3b76b63e", "url": "https://llm-d.ai/blog/kvcache-wins-you-can-see",
               "where":
                   "'Performance Results' table and Appendix A.1-A.2 (8 pods of 2 H100, Qwen3-32B, 307,328 KV tokens "
                   "per instance; the blog's table gives load-scheduling 4428.7 output tokens/s where the report "
                   "gives 4266.4)",
               "licence": "not stated for the blog: figures and settings only, with the source named"}],
        note=
            "the blog's summary row for load-scheduling (4428.7 tokens/s) differs from the report's (4266.4): the "
            "report's tables are used; the QPS = 15 table may include the warm-up stage (also 15 requests/s): "
            "compared as the main stage")

    r37 = prefix_result(
        "llm-d-precise-prefix-37",
            "llm-d: precise prefix-cache aware scheduling vs default, load-aware and random (4 x Llama-3.1-70B TP 4 "
            "on H100, shared prefixes at 37% of the fleet's KV)",
        t37, path="benchmarking/37-capacity/README.md", model="llama-3.1-70b", tp=4, replicas=4, kv_tokens=461376,
        workload={"kind": "shared-prefix", "groups": 83, "prompts_per_group": 3, "system_prompt_tokens": 8000,
                  "question_tokens": 1000, "output_tokens": 1000, "ignore_eos": True, "arrivals": "constant",
                  "stages": [{"rate": 9, "duration_s": 30, "warmup": True}] + [
                      {"rate": r, "duration_s": d} for r, d in (
                          (3, 210), (4, 180), (5, 120), (6, 120), (8, 90), (10, 70), (12, 60), (15, 50), (20, 50))],
                  "load_generator": inference_perf},
        strategies={
            "random-scheduling": {"router": "random"},
            "load-scheduling": {"router": "scored", "weights": {"queue": 1.0, "kv-cache": 1.0}},
            "default-scheduling": {"router": "prefix-approx",
                                   "weights": {"prefix": 2.0, "kv-cache": 1.0, "queue": 1.0},
                                   "scorer": "GIE's prefix-cache-scorer, default parameters"},
            "precise-scheduling": {"router": "prefix", "weights": {"prefix": 3.0, "kv-cache": 2.0, "queue": 2.0},
                                   "scorer": "llm-d's prefix-cache-scorer in cache_tracking mode, blockSize 64, "
                                   "weights as the README's precise-scheduling profile (assumed: those of the 73% "
                                   "run)"},
        },
        note=
            "inference-perf's 'constant' load (September 2025) draws exponential gaps and scales them to sum to the "
            "stage's duration: Poisson-like arrivals with an exact count")

    distserve_fig6 = {
        "id": "distserve-colocated-vs-2p1d", "title":
            "DistServe: goodput of one colocated vLLM GPU vs 2 prefill + 1 decode GPUs (13B model on A100-80GB, 512 "
            "in / 64 out)",
        "split": "validate",
        "source": {"repository": "hao-ai-lab/hao-ai-lab.github.io", "path": "content/blogs/distserve/index.md",
                   "commit": "821a7fe7d3be54a90ad98378278e83e8017c9d41", "url": "https://hao-ai-lab.github.io/blogs/distserve/",
                   "where":
                       "section 'New Approach: Disaggregation + Tailored Parallelism Strategy', Figure 6 and the "
                       "goodput sums under it"},
        "also": [{"repository": "LLMServe/DistServe", "commit": "82831f1604cc6b10bebd360f6c437a07790dde9f",
                  "path": "evaluation/2-benchmark-serving/2-start-api-server.py", "licence": "Apache-2.0",
                  "where":
                      "the vLLM baseline's server flags used for the paper's experiments (block 16, "
                      "gpu-memory-utilization 0.95, max-num-batched-tokens 16384, max-num-seqs 1024, fp16)"}],
        "licence": "no licence file found in the blog's repository: figures and settings only, with the source named",
        "deployment": {"engine": "vllm", "model": "opt-13b", "gpu": "A100-80GB", "tp": 1, "replicas": 1,
                       "gpu_memory_utilization": 0.95, "block_size": 16, "max_num_batched_tokens": 16384,
                   "max_num_seqs": 1024},
        "workload": {"kind": "fixed-lengths", "prompt_tokens": 512, "output_tokens": 64, "arrivals": "poisson"},
        "slo": {"ttft_p90_s": 0.4, "tpot_p90_s": 0.04},
        "strategies": {
            "colocated": {"router": "round-robin", "sweep": "rate"},
            "2P1D": {"router": "round-robin", "sweep": "rate", "prefill": 2, "decode": 1, "kv_link": "nvlink"},
            "prefill-only": {"router": "round-robin", "sweep": "rate", "prefill": 1, "decode": 4,
                             "kv_link": "nvlink", "note": "one prefill worker, decode never the bound (4 of them)"},
            "decode-only": {"router": "round-robin", "sweep": "rate", "prefill": 4, "decode": 1,
                            "kv_link": "nvlink", "note": "one decode worker, prefill never the bound (4 of them)"},
        },
        "published": {
            "metrics": {"rate_ttft_slo": "highest Poisson rate (requests/s per GPU) whose P90 TTFT stays within 0.4 s",
                        "rate_tpot_slo": "highest rate whose P90 TPOT stays within 0.04 s",
                        "goodput_per_gpu": "min of the two: requests/s per GPU within both SLOs"},
            "figures": {"colocated": {"rate_ttft_slo": 3.0, "rate_tpot_slo": 1.6, "goodput_per_gpu": 1.6},
                        "prefill-only": {"rate_ttft_slo": 5.6}, "decode-only": {"rate_tpot_slo": 10.0},
                        "2P1D": {"goodput_per_gpu": 3.3}},
            "read_from":
                "the text: 'roughly 3 rps' within the TTFT SLO, 'it sustains 1.6 rps' within the TPOT SLO, 'Goodput "
                "(colocate) = min(2.3, 1.6) = 1.6 rps (per GPU)', 'one prefill worker achieves roughly 5.6 rps and "
                "one decode worker achieves roughly 10 rps', 'Goodput (2P1D) = min(5.6 x 2, 10) = 10 reqs/s / 3 GPUs "
                "= 3.3 reqs/s (per GPU)'; the text gives the TTFT-bound rate as 3 and the sum as 2.3: 3.0 is kept, "
                "2.3 noted here"},
        "assumed": [
            "the 13B model is OPT-13B (the paper's 13B model; the blog says only '13B LLM')",
            "the colocated system is vLLM with the server flags DistServe's artifact used for its vLLM baseline "
                "(block 16, utilization 0.95, 16,384 batched tokens, 1,024 sequences); the blog's run was of "
                "early-2024 vLLM, which prefilled whole prompts first: the simulator runs the newest vLLM policy, "
                "whose chunked prefill at 16,384 tokens a step takes a 512-token prompt whole",
            "P90 TPOT over requests as vLLM's benchmark counts it ((e2e - ttft) / (output - 1))",
            "400 requests per rate, Poisson arrivals (seeded), rates from 0.2 requests/s up in steps of 0.2 "
                "until both P90s are over their SLOs (at most 32); the SLO-bound rate is interpolated between the "
                "two rates around it, as DistServe's plotting script does (find_intersection in "
                "evaluation/ae-scripts/e2e/_plot.py)",
            "the time model is kvbudget's default for the A100-80GB, no calibration",
        ],
    }

    distserve_fig8 = {
        "id": "distserve-chatbot-goodput", "title":
            "DistServe (OSDI'24): chatbot goodput of disaggregated serving vs vLLM on ShareGPT (OPT-13B/66B/175B, "
            "A100-80GB)",
        "split": "validate",
        "source": {"repository": "hao-ai-lab/hao-ai-lab.github.io", "path": "content/blogs/distserve/index.md",
                   "commit": "821a7fe7d3be54a90ad98378278e83e8017c9d41", "url": "https://hao-ai-lab.github.io/blogs/distserve/",
                   "where":
                       "section 'DistServe: Evaluate the effectiveness of Disaggregation', Figure 8 and the list "
                       "under it"},
        "also": [{"repository": "LLMServe/DistServe", "commit": "82831f1604cc6b10bebd360f6c437a07790dde9f",
                  "licence": "Apache-2.0",
                  "paths": ["evaluation/2-benchmark-serving/2-start-api-server.py",
                            "evaluation/ae-scripts/e2e/opt-13b-vllm-client.sh",
                            "evaluation/ae-scripts/e2e/opt-13b-distllm-client.sh"],
                  "where":
                      "placements (context TP, PP, decoding TP, PP): OPT-13B (2, 1, 1, 1), OPT-66B (4, 1, 2, 2), "
                      "OPT-175B (3, 3, 4, 3); vLLM at TP 1, 4, 8; the rates swept (vLLM OPT-13B: 100 prompts at "
                      "0.25-3 requests/s; DistServe: 300 prompts at 0.75-9 requests/s across its GPUs); a "
                      "round-robin proxy in front of data-parallel copies"}],
        "licence":
            "no licence file found in the blog's repository: figures only, with the source named; DistServe's scripts "
            "Apache-2.0",
        "deployment": {"engine": "vllm", "model": "opt-13b", "gpu": "A100-80GB", "tp": 1, "block_size": 16,
                       "gpu_memory_utilization": 0.95, "max_num_batched_tokens": 16384, "max_num_seqs": 1024},
        "workload": {"kind": "dataset", "dataset": "ShareGPT (DistServe's preprocessing, OPT tokenizer)",
                     "arrivals": "poisson"},
        "strategies": {"vllm": {"needs":
            "ShareGPT's prompt and output lengths as DistServe sampled them, and the paper's chatbot SLOs (Table 1 "
            "of the paper, not read in this session)"},
                       "distserve": {"needs":
                           "disaggregated prefill/decode with per-pool TP and PP (pd slice), ShareGPT lengths, the "
                           "SLOs"}},
        "published": {"metrics": {"goodput_ratio": "DistServe's per-GPU rate at 90% SLO attainment over vLLM's"},
                      "figures": {"chatbot": {"goodput_ratio_min": 2.0, "goodput_ratio_max": 3.41}},
                      "read_from": "'Chatbot: DistServe sustains 2.0x - 3.41x higher goodput compared to vLLM.'"},
        "assumed": ["recorded for the lead to wire once disaggregated pools exist; nothing here runs yet"],
    }

    doc = {
        "about":
            "Published fleet results (several replicas behind a router, or prefill and decode pools) with the inputs "
            "to simulate them, for benchmarks/fleet_published.py. Every figure is copied from the source named "
            "beside it; every input not stated there is listed under 'assumed'. Validation data: nothing in kvbudget "
            "is fitted on these (split 'validate').",
        "results": [r73, r37, distserve_fig6, distserve_fig8],
    }
    OUT.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
