"""The host-tier guide's picture: TTFT and prompt tokens served from cache against the CPU tier's size, for
Llama-3.1-8B on one H100 under the Mooncake conversation trace at a tenth of its rate (simulated, vLLM 0.32's
native offloading connector), beside the share `kvbudget plan --trace` estimates from the trace's reuse curve
(no scheduler). Writes docs/guides/host-tier.png; prints the figures it plots and the estimate's error, and the
same comparison for a second deployment (the same model on one L40S: a smaller GPU pool) that is not drawn."""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kvbudget.engines.scheduling.workload import read_trace, rescale
from kvbudget.model.load import load_model
from kvbudget.planner import plan
from kvbudget.reuse import reuse_curve
from kvbudget.simulation.run import simulate
from kvbudget.traces import resolve
from kvbudget.units import GIB

SIZES_GIB = (0, 64, 256, 1024, 2048, 4096)


def compare(name: str, gpu: str, max_len: int, sizes: tuple[int, ...], requests: list) -> list[tuple]:
    """Simulated TTFT and hits at each tier size, and the reuse curve's estimate of the hits."""
    model = load_model(name)
    curve = reuse_curve(requests, "mooncake-conv")
    gpu_tokens = plan(model, gpu=gpu, max_model_len=max_len).capacity.physical_token_slots
    rows = []
    print(f"{name} on one {gpu}: GPU pool {gpu_tokens:,} tokens")
    for gib in sizes:
        sim = simulate(model, requests, gpu=gpu, max_model_len=max_len, offload_memory=gib * GIB if gib else None)
        host = sim.offload.hit_tokens / sim.prompt_tokens if sim.offload else 0.0
        gpu_hits = sim.prefix_hit_rate or 0.0
        tier = sim.setup.host_tier.tokens if sim.setup.host_tier else 0
        estimate = curve.share(max(tier, gpu_tokens))
        assert sim.ttft is not None
        rows.append((gib, sim.ttft.p50, sim.ttft.p90, gpu_hits, host, estimate))
        print(f"{gib:>5} GiB  TTFT p50 {sim.ttft.p50:6.2f} s  p90 {sim.ttft.p90:6.2f} s  hits GPU {gpu_hits:.1%} "
              f"host {host:.1%}  together {gpu_hits + host:.1%}  plan's estimate {estimate:.1%} "
              f"({100 * (estimate - gpu_hits - host):+.1f} points)")
    return rows


def main() -> int:
    requests = list(rescale(read_trace(resolve("mooncake-conv")), 0.1))
    compare("llama-3.1-8b", "L40S", 131072, (0, 16, 64, 256, 1024), requests)
    rows = compare("llama-3.1-8b", "H100-80GB", 131072, SIZES_GIB, requests)
    fig, (ax, hits) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = [max(r[0], 16) for r in rows]
    ax.plot(x, [r[1] for r in rows], "o-", label="p50")
    ax.plot(x, [r[2] for r in rows], "s-", label="p90")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, ["none" if r[0] == 0 else f"{r[0]:,}" for r in rows])
    ax.set_xlabel("CPU tier, GiB (--kv-offloading-size)")
    ax.set_ylabel("time to first token, s (estimate)")
    ax.legend()
    hits.stackplot(x, [100 * r[3] for r in rows], [100 * r[4] for r in rows], labels=["GPU prefix cache", "CPU tier"])
    hits.plot(x, [100 * r[5] for r in rows], "k--", label="plan's estimate (reuse curve)")
    hits.set_xscale("log", base=2)
    hits.set_xticks(x, ["none" if r[0] == 0 else f"{r[0]:,}" for r in rows])
    hits.set_xlabel("CPU tier, GiB")
    hits.set_ylabel("prompt tokens served from cache, %")
    hits.legend(loc="upper left")
    fig.suptitle("Llama-3.1-8B, one H100, Mooncake conversation trace at 0.1x (simulated)", fontsize=10)
    fig.tight_layout()
    out = Path(__file__).resolve().parents[1] / "docs" / "guides" / "host-tier.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
