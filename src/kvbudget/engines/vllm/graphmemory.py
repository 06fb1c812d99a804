"""The CUDA-graph memory vLLM >= 0.20 takes out of the KV budget: its own estimate, made by the source's arithmetic.

From the source (`v1/worker/gpu_model_runner.py` profile_cudagraph_memory, read in the 0.30.0 wheel; memory.py
reads the same capture rule in 0.20.0, 0.24.0, 0.28.0 and 0.32.0; the fit logs are 0.19's, which print the
estimate without subtracting it, its arithmetic not read): for each graph mode (PIECEWISE, FULL) vLLM captures the
two largest graphs of that mode into a throwaway pool, measuring the device's free memory before and after each; it
then returns

    max(first capture over the modes) + sum over the modes of max(second capture, 1 MiB) x (graphs of the mode - 1)

(the modes share one pool at run time, so only the larger first capture counts; every further graph is taken to
cost what the second did). `gpu_worker.py` determine_available_memory subtracts that figure from the budget.

What the first capture takes is partly the source's: it empties torch's cache first (torch.accelerator.empty_cache),
then _warmup_and_capture runs the largest graph's batch once without a graph (_dummy_run, its activations cached
again by torch) and once under capture (into the graph pool), so the first capture holds the forward pass's buffers
at the largest size twice (`pool`: kvbudget's forward estimate at that size, budget.activation_estimate). The rest
is the CUDA driver's and the pool's, which the source leaves open, so two figures are fitted, not read (on the fit
cases of tests/data/memory/graphs.json alone: vLLM's own estimates, printed as "Estimated CUDA graph memory", with
the graphs it profiled):
- GRAPH_PER_LAYER: what one more graph costs, per decoder layer on the rank (a PIECEWISE graph is one piece per
  layer; a FULL graph's kernel nodes grow with the layers too).
- GRAPH_FIRST: the rest of the larger first capture.
Both are the least-squares line of (the logged estimate - 2 x pool) over (graphs - 1 per mode) x layers, rounded up
(the slope to the KiB, the intercept to 0.01 GiB). The logs spread about it by up to 0.9 GiB (one tensor-parallel
Llama-3.1-8B run logs 1.69 GiB where its sibling on four GPUs logs 0.57): the fit is the middle, not a bound.

FlashInfer's workspace (`v1/attention/backends/flashinfer.py` _get_workspace_buffer, read in 0.27.0, 0.30.0 and
0.33.0): where FlashInfer runs the attention, its metadata builder makes a workspace of max(394 MiB
(VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE's default, envs.py), max_num_batched_tokens x query heads on the rank x head
size x 16 bytes (FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM)) the first time it builds attention metadata. The
profiling pass builds none (profile_run's _dummy_run forces no attention), so the first FULL capture makes it
(_warmup_and_capture forces attention for FULL graphs) and it lands in the first capture, which the fit cases (H100s
on FlashAttention 3) do not hold. Which start-ups run FlashInfer: an fp8 cache on compute capability 8.x (Ampere,
Ada): FlashAttention takes an fp8 cache only as FA3 on 9.x or FA4 on 10.x (`fa_utils.py`
flash_attn_supports_kv_cache_dtype), and FlashInfer is next in `platforms/cuda.py` _get_backend_priorities. Data-centre
Blackwell (10.x) runs FlashInfer first for every cache dtype: not modelled (no log with graphs to check it on).
"""

from __future__ import annotations

from kvbudget.units import GIB, KIB, MIB

# fitted on graphs.json's fit cases: 101.5 KiB and 0.436 GiB (least squares, rounded up)
GRAPH_PER_LAYER = 102 * KIB
GRAPH_FIRST = int(0.44 * GIB)
PER_GRAPH_FLOOR = MIB  # the source's floor: "Use at least 1 MiB per graph for driver overhead"
FLASHINFER_WORKSPACE = 394 * MIB  # envs.py VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE
FLASHINFER_BYTES_PER_ELEM = 16  # flashinfer.py FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM
FLASHINFER_WORKSPACE_READ = ((0, 27), (0, 33))  # the releases read (0.27.0, 0.30.0, 0.33.0)


def estimate(piecewise: int, full: int, layers: int, pool: int, workspace: int = 0) -> int:
    """vLLM's CUDA-graph estimate for `piecewise` and `full` graphs of a model with `layers` decoder layers on the
    rank whose forward pass at the largest graph's size holds `pool` bytes: the first capture, then every further
    graph of each mode at the second's cost (see above); `workspace`: what the first FULL capture also makes (an
    attention backend's workspace), none without FULL graphs."""
    if piecewise + full == 0:
        return 0
    per_graph = max(GRAPH_PER_LAYER * layers, PER_GRAPH_FLOOR)
    first = GRAPH_FIRST + 2 * pool + (workspace if full else 0)
    return first + per_graph * sum(n - 1 for n in (piecewise, full) if n)


def flashinfer_workspace(version: tuple[int, int], compute_capability: str | None, kv_cache_dtype: str | None,
                         max_num_batched_tokens: int, heads: int, head_size: int) -> int:
    """The FlashInfer workspace vLLM `version` makes in its first FULL capture (see above) for a cache of
    `kv_cache_dtype` on a GPU of `compute_capability`, with `heads` query heads of `head_size` on the rank; 0 where
    FlashAttention runs the attention or the release was not read."""
    if not (FLASHINFER_WORKSPACE_READ[0] <= version <= FLASHINFER_WORKSPACE_READ[1]):
        return 0
    if not (compute_capability or "").startswith("8.") or not (kv_cache_dtype or "").startswith("fp8"):
        return 0
    return max(FLASHINFER_WORKSPACE, max_num_batched_tokens * heads * head_size * FLASHINFER_BYTES_PER_ELEM)


def note(size: int, counts: str, graphs: int, largest: int, layers: int, workspace: int = 0) -> str:
    """What the plan says of an estimate of `size` bytes for `graphs` graphs (`counts`, as vLLM logs them), the
    largest of `largest` tokens, of a model with `layers` layers (`workspace`: FlashInfer's, where it is made)."""
    made = (f", and FlashInfer's workspace ({workspace / MIB:.0f} MiB: an fp8 cache on this card runs FlashInfer)"
            if workspace else "")
    return (f"CUDA graphs ({size / GIB:.2f} GiB: vLLM >= 0.20 subtracts its estimate for the {graphs} graphs it "
            f"captures, {counts}: the first capture, holding the forward pass at {largest} tokens twice{made}, and "
            f"each further graph at the second's cost, {layers} layers; fit: {GRAPH_FIRST / GIB:.2f} GiB more "
            f"first, {GRAPH_PER_LAYER // KIB} KiB a graph per layer)")
