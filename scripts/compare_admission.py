"""The admission policies side by side on real traces, from light load to twice what the deployment can serve:
the engine alone (vLLM queues, preempts, recomputes), the llm-d router's saturation shedding (at 5 waiting or 0.8
KV usage, its defaults), its flow control (llm-d-router v0.10: a queue at the gateway of 5,000 requests, 60 s each;
the time a request waits there counts in its TTFT), a static limit of 64 requests in flight, and kvbudget's
guard on the plan's KV budget, with its default levels and with its output caps off, each also with max_waiting 5.
Llama-3.1-8B on one L40S,
vLLM 0.32 scheduling (exact), step times from the fitted kernels (an estimate).

Per run: requests served in full within the SLO (TTFT <= 2 s and TPOT <= 100 ms, with all the output the request
would have generated), served in full but late, served with their output capped, rejected; preemptions and
recomputed tokens; TTFT p50 and p99
of what was served. Prints the table docs/guides/admission.md shows and writes docs/guides/admission.png.
About 11 minutes on two cores."""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kvbudget.engines.scheduling.workload import read_trace, rescale
from kvbudget.model.load import load_model
from kvbudget.simulation.fleet import Pool, simulate_fleet
from kvbudget.simulation.run import setup_for, simulate

# (label, simulate's admission, the guard's configuration): kvbudget with its default levels, with caps off
# (max_tokens_fraction 1: level 1 leaves output limits alone, level 2 forces one sample, level 3 rejects), and
# each with max_waiting 5 (new requests refused while 5 wait in the engine's queue, GIE's queue threshold)
POLICIES = (("none", "none", None), ("gie", "gie", None), ("llm-d", "llm-d", None),
            ("concurrency:64", "concurrency:64", None),
            ("kvbudget", "kvbudget", None), ("kvbudget, no caps", "kvbudget", {"max_tokens_fraction": 1.0}),
            ("kvbudget, queue 5", "kvbudget", {"max_waiting": 5}),
            ("kvbudget, no caps, queue 5", "kvbudget", {"max_tokens_fraction": 1.0, "max_waiting": 5}))
SCALES = (0.5, 1.0, 1.25, 1.5, 2.0)  # of the trace's own rate; the L40S serves about 1.3x of azure-conv-2023
TRACES = (("azure-conv-2023", 3000), ("azure-code-2023", 1500))
SLO_TTFT, SLO_TPOT = 2.0, 0.1


def run(model, trace: str, count: int, scale: float, policy: tuple) -> dict:
    requests = list(rescale(read_trace(trace), scale, 0, count))
    asked = {r.id: r.output_tokens for r in requests}
    good = served = capped = 0
    ttfts: list[float] = []

    def finished(r, ttft, tpot, e2e) -> None:
        nonlocal good, served, capped
        served += 1
        ttfts.append(ttft)
        if r.output_tokens < asked[r.id]:
            capped += 1
        elif ttft <= SLO_TTFT and (tpot is None or tpot <= SLO_TPOT):
            good += 1

    label, admission, config = policy
    if admission == "llm-d":  # the queue at the gateway: a fleet of one replica; its wait counts in the TTFT
        arrived = {r.id: r.arrival for r in requests}
        fleet = simulate_fleet(model, requests, [Pool(name="main", setup=setup_for(model, gpu="L40S"))],
                               admission=admission, on_finish=lambda i, r, ttft, tpot, e2e: finished(
                                   r, ttft + r.arrival - arrived[r.id], tpot, e2e))
        ttfts.sort()
        return row(trace, scale, label, len(requests), (good, served, capped), fleet.refused, fleet.preemptions,
                   sum(x.simulation.recomputed_tokens for x in fleet.replicas), ttfts)
    sim = simulate(model, requests, gpu="L40S", admission=admission, guard_config=config, on_finish=finished)
    ttfts.sort()
    rejected = sim.guard.rejected if sim.guard is not None else 0
    return row(trace, scale, label, len(requests), (good, served, capped), rejected, sim.preemptions,
               sim.recomputed_tokens, ttfts)


def row(trace: str, scale: float, label: str, requests: int, counts: tuple[int, int, int], rejected: int,
        preemptions: int, recomputed: int, ttfts: list[float]) -> dict:
    good, served, capped = counts
    return {"trace": trace, "scale": scale, "policy": label, "requests": requests, "good": good,
            "served": served, "rejected": rejected, "capped": capped,
            "preemptions": preemptions, "recomputed": recomputed,
            "ttft_p50": ttfts[len(ttfts) // 2] if ttfts else None,
            "ttft_p99": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] if ttfts else None}


def main() -> int:
    model = load_model("llama-3.1-8b")
    rows = [run(model, trace, count, scale, policy) for trace, count in TRACES for scale in SCALES
            for policy in POLICIES]
    print("| trace | load | policy | in full within SLO | in full, late | capped | rejected | preemptions | "
          "recomputed tokens | TTFT p50 | TTFT p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        late = r["served"] - r["good"] - r["capped"]
        p50 = "-" if r["ttft_p50"] is None else f"{r['ttft_p50']:.2f} s"
        p99 = "-" if r["ttft_p99"] is None else f"{r['ttft_p99']:.2f} s"
        print(f"| {r['trace']} | {r['scale']:g}x | {r['policy']} | {r['good'] / r['requests']:.1%} | "
              f"{late / r['requests']:.1%} | {r['capped'] / r['requests']:.1%} | {r['rejected'] / r['requests']:.1%} | "
              f"{r['preemptions']:,} | "
              f"{r['recomputed']:,} | {p50} | {p99} |")
    fig, axes = plt.subplots(1, len(TRACES), figsize=(11, 4.5), sharey=True)
    for ax, (trace, _) in zip(axes, TRACES, strict=True):
        for label, _, _ in POLICIES:
            mine = [r for r in rows if r["trace"] == trace and r["policy"] == label]
            ax.plot([r["scale"] for r in mine], [100 * r["good"] / r["requests"] for r in mine],
                    "s--" if "queue" in label else "o-", label=label)
        ax.set_title(trace, fontsize=10)
        ax.set_xlabel("load (x the trace's rate)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("requests served in full within the SLO, %")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Llama-3.1-8B, one L40S, vLLM 0.32 (simulated): admission policies; SLO TTFT <= {SLO_TTFT:g} s, "
                 f"TPOT <= {SLO_TPOT * 1e3:g} ms", fontsize=10)
    fig.tight_layout()
    out = Path(__file__).resolve().parents[1] / "docs" / "guides" / "admission.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
