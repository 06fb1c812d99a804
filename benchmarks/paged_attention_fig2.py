"""Reproduces the PagedAttention paper's Fig. 2 (Kwon et al., SOSP'23): where a KV cache's memory goes with
contiguous reservations (Orca Max / Pow2 / Oracle) against paging, averaged over a serving run.

The paper's setting (§6.1-6.2): OPT-13B on one A100-40GB, 12 GB of KV cache (800 KiB per token: about 15.7k
token slots), ShareGPT requests (mean 161 prompt and 338 output tokens), Poisson arrivals. Its figures for the
share of KV memory holding token states: Orca (Max) 20.4%, Orca (Pow2) 26.8%, Orca (Oracle) 38.2%, vLLM 96.3%.
The baselines follow the paper's §6.1: its own Orca placing reservations with the buddy allocation algorithm, Pow2
reserving the prompt plus the output rounded up to a power of two. ShareGPT itself is not on this machine:
lengths here are geometric with the paper's means, capped at 2,048 tokens, or (`--lengths FILE`, made by
`sharegpt_lengths.py`) drawn from real ShareGPT conversations tokenized as OPT does. Arrivals saturate every
system (a queue builds; with real lengths use `--rate 8` for vLLM), as the paper's comparison at equal load does.
Prints figures; asserts nothing.

    python benchmarks/paged_attention_fig2.py [--rate 4] [--requests 2000] [--seed 0] [--lengths FILE.json]
"""

from __future__ import annotations

import argparse
import json

import kvbudget
from kvbudget.engines.scheduling.workload import sampled_lengths
from kvbudget.simulation import exponential_lengths, simulate, synthetic

PAPER = {"contiguous-max": 20.4, "contiguous-pow2": 26.8, "contiguous-oracle": 38.2, "paged": 96.3}
NAMES = {"contiguous-max": "Orca (Max)", "contiguous-pow2": "Orca (Pow2)", "contiguous-oracle": "Orca (Oracle)",
         "paged": "vLLM (paged)"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lengths", help="JSON list of [prompt, output] pairs (sharegpt_lengths.py)")
    a = ap.parse_args()
    model = kvbudget.load_model("opt-13b")
    if a.lengths:
        with open(a.lengths, encoding="utf-8") as f:
            lengths = sampled_lengths([tuple(pair) for pair in json.load(f)])
        where = f"lengths drawn from {a.lengths}"
    else:
        lengths = exponential_lengths(161, 338, 2048)
        where = "geometric lengths (means 161 / 338, capped at 2,048)"
    print(f"OPT-13B, A100-40GB, 12 GiB KV, {a.requests} requests at {a.rate}/s (Poisson), {where}")
    print(f"{'system':<15} {'slots':>6} {'token states':>13} {'paper':>6} {'reserved':>9} {'internal':>9} "
          f"{'free/ext.':>9} {'mean running':>13}")
    for allocator in PAPER:
        sim = simulate(model, synthetic(a.rate, a.requests, lengths, a.seed),
                       gpu="A100-40GB", kv_memory=12 * 2**30, max_model_len=2048, allocator=allocator)
        m = sim.memory
        running = sum(s.running for s in sim.timeline) / max(1, len(sim.timeline))
        print(f"{NAMES[allocator]:<15} {sim.setup.token_slots:>6,} {m.token_states:>12.1%} {PAPER[allocator]:>5}% "
              f"{m.reservation:>9.1%} {m.internal:>9.1%} {m.other:>9.1%} {running:>13.1f}")
    print(f"Orca (Max) fits {15_728 // 2048} requests of 2,048 tokens at once: "
          f"⌊{12 * 2**30 / (800 * 1024):,.1f} / 2,048⌋")


if __name__ == "__main__":
    main()
