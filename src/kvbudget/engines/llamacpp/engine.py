"""llama.cpp (`llama-server`): the whole KV buffer is allocated when the server starts.

Read from src/llama-context.cpp, llama-kv-cache.cpp, llama-kv-cache-iswa.cpp and llama-memory-recurrent.cpp of
the llama.cpp copy in llama-cpp-python 0.3.36, and checked against real llama-server runs in
tests/engines/test_llamacpp_real.py:

- `-c` is padded to a multiple of 256 cells; with `-np N` slots and no `--kv-unified` every slot gets its own
  stream of `pad256(n_ctx / N)` cells;
- a cell of a layer holds `row_size(type_k, Hkv x Dk) + row_size(type_v, Hkv x Dv)` bytes, row_size counting
  whole blocks (q8_0: 34 bytes per 32 values);
- sliding-window layers get `pad256(min(cells, n_swa + n_ubatch))` cells per stream unless `--swa-full`;
  Llama-4's chunked layers go to the same SWA cache with n_swa = 8192;
- MLA (deepseek2) caches one 576-wide K row per cell and no V;
- recurrent layers (Mamba, gated delta net) keep f32 state: `(d_conv - 1) x channels` plus the SSM state,
  one cell per sequence.

The memory map's "batch x context" is the server started with `-np batch -c batch x context`. Older builds
(`--engine llamacpp@b5500`) padded to 32 cells without flash attention, cached sliding windows in full and had
one stream for every sequence: engines/llamacpp/releases.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from kvbudget.dtypes import Family, KVDtype, get_dtype, resolve_kv_dtype
from kvbudget.engines.base import (
    DEFAULT_SAMPLED_ROWS,
    NON_TORCH_ESTIMATE,
    Allocation,
    CacheGroup,
    Capacity,
    Engine,
    EngineOptions,
    Offload,
    OutputLimit,
    Serving,
    UsageGauge,
    cheaper_if_wider,
    group_layers,
    largest_fitting,
)
from kvbudget.engines.kinds import KindTable, no_cache
from kvbudget.engines.llamacpp.gauges import llamacpp_pool, slots_usage
from kvbudget.engines.llamacpp.releases import (
    CACHE_TYPES,
    N_BATCH,
    N_UBATCH,
    NEWEST,
    NEWEST_BUILD,
    Release,
    parse_build,
)
from kvbudget.engines.metrics import PoolGauge, PoolReport, tokens_budget
from kvbudget.engines.tiers import HostTier, no_disk
from kvbudget.errors import EngineRuleError, KVBudgetError, UnsupportedArchitectureError
from kvbudget.model.spec import (
    Attention,
    ChunkedLocal,
    FullAttention,
    IndexerKeys,
    LatentAttention,
    LayerSpec,
    ModelSpec,
    NoCache,
    RecurrentState,
    SlidingWindow,
)
from kvbudget.speculative import SpecMethod, Speculative
from kvbudget.units import MIB, cdiv, format_bytes
from kvbudget.validate import positive

CELL_PAD = 256
LLAMA4_CHUNK = 8192  # src/models/llama4.cpp sets n_swa = 8192 whatever the config says
# Architectures whose sliding windows llama.cpp honours (swa_type set in src/models/*.cpp); every other one,
# Mistral-7B-v0.1 (llama arch) and Phi-3 ("Phi SWA is currently disabled") included, is cached in full.
HONOURS_WINDOW = frozenset({"gemma2", "gemma3_text", "gemma3n_text", "gpt_oss", "llama4_text"})
_F32 = get_dtype("float32")
_F16 = get_dtype("float16")


def pad(n: int, to: int = CELL_PAD) -> int:
    return cdiv(n, to) * to


def attention_scratch(model: ModelSpec, cells: int, n_ubatch: int, flash: bool, release: Release) -> int:
    """The part of llama.cpp's compute buffer that grows with the context, for a stream of `cells` cells: the KQ
    mask of each cache (n_kv x n_ubatch, f16 with flash attention, f32 without; the sliding or chunked cache has
    its own) and, without flash attention, one layer's scores in f32 (llm_graph_context::build_attn_mha:
    ggml_mul_mat(k, q), n_kv x n_ubatch x query heads; the softmax runs in place). The graph's per-token tensors
    (hidden states, MLP) are not in it."""
    per_cell = 2 if flash else 4
    masks: dict[bool, int] = {}
    scores = 0
    swa_batch, to = release.swa_batch(n_ubatch, N_BATCH), release.padding(flash)
    for layer in (_as_cached(layer, model, release) for layer in model.layers):
        if not isinstance(layer, (Attention, LatentAttention)):
            continue
        windowed = isinstance(layer, (SlidingWindow, ChunkedLocal))
        n_kv = _window_cells(layer, cells, swa_batch, to) if isinstance(layer, (SlidingWindow, ChunkedLocal)) \
            else cells
        masks[windowed] = n_kv
        heads = layer.heads if isinstance(layer, LatentAttention) else (
            model.attention_heads or layer.kv_heads)
        scores = max(scores, n_kv * heads * 4)
    return n_ubatch * (sum(masks.values()) * per_cell + (0 if flash else scores))


def compute_estimate(model: ModelSpec, cells: int, n_ubatch: int, flash: bool, release: Release) -> int:
    """The whole compute buffer where its graph is not replayed: the per-token tensors of one ubatch (an estimate)
    and the part that grows with the context (`attention_scratch`)."""
    from kvbudget.budget import activation_estimate

    return (activation_estimate(model, n_ubatch, DEFAULT_SAMPLED_ROWS)
            + attention_scratch(model, cells, n_ubatch, flash, release))


def compute_buffer(model: ModelSpec, cells: int, n_tokens: int, n_parallel: int, flash: bool, release: Release,
                   quantized: bool = False, unified: bool = False) -> tuple[int, bool]:
    """llama-server's compute buffer for `cells` cells per stream, a prompt batch of `n_tokens` (min(n_ctx,
    n_batch, n_ubatch)) and `n_parallel` slots (`unified`: one stream for them all), and whether it is replayed
    from the graph (graph.py: exact on the CPU backend) rather than estimated. Replayed for the families graph.py
    builds, in the newest build, with an unquantized cache (a quantized one adds a Hadamard rotation)."""
    from kvbudget.engines.llamacpp import graph

    shapes = graph.shapes_of(model) if release.build == NEWEST_BUILD and not quantized else None
    if shapes is None:
        return compute_estimate(model, cells, n_tokens, flash, release), False
    to, sequences = release.padding(flash), n_parallel if unified else 1
    caches = tuple((True, _window_cells(layer, cells, n_tokens, to, sequences))
                   if isinstance(layer, (SlidingWindow, ChunkedLocal)) else (False, cells)
                   for layer in (_as_cached(layer, model, release) for layer in model.layers))
    return graph.compute_buffer(shapes, caches, n_tokens, n_parallel, flash), True


# common/speculative.cpp: the most a draft's vocabulary may differ from the target's
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128


def release_of(options: EngineOptions) -> Release:
    return Release(options.engine_version[0]) if options.engine_version else Release()


def flash_attn_of(options: EngineOptions, release: Release) -> bool:
    """-fa as given by attention_backend ("flash" / "no-flash"), else the build's default."""
    backend = options.attention_backend
    if backend is None:
        return release.flash_attn_default
    if backend.lower() in ("flash", "fa", "on"):
        return True
    if backend.lower() in ("no-flash", "off"):
        return False
    raise EngineRuleError(f"attention_backend {backend!r}: for llama.cpp give flash (-fa on) or no-flash (-fa off)",
                          param="attention_backend")


@dataclass(frozen=True, kw_only=True)
class Buffer:
    """One cache llama-server creates, as its log line reports it."""

    name: str  # "kv" (non-SWA), "kv_swa" or "recurrent"
    cells: int  # per stream
    streams: int
    layers: int
    k_bytes: int  # K (or R for recurrent) over all layers and streams
    v_bytes: int  # V (or S for recurrent)

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes


@dataclass(frozen=True)
class LlamaCppEngine(Engine):
    name: str = "llamacpp"
    unchecked_families: ClassVar[dict[str, str]] = {
        "gemma4_text": ("Gemma 4's global layers (attention_k_eq_v: V is a normalised copy of K) have not been checked "
                        "against llama.cpp's own cache")}
    description: str = "llama.cpp llama-server: whole buffer up front, cells padded to 256"

    serves = True
    prompt_adds_bos = True  # llama-server adds the vocabulary's BOS in front of the rendered prompt
    # No KV gauge in /metrics (llamacpp:kv_cache_usage_ratio was removed): /slots, which may be disabled.
    # The alerts read the guard's scrape of /slots, labelled by replica.
    usage = UsageGauge(path="/slots", read=slots_usage, promql="max by (replica) (kvbudget_guard_observed_usage)",
                       health_path="/health", series="kvbudget_guard_observed_usage", by="replica")
    pool_gauge = PoolGauge(paths=("/props",), read=llamacpp_pool)
    queue_gauges = ("llamacpp:requests_processing", "llamacpp:requests_deferred")  # llama-server --metrics
    # n_predict, else its aliases max_completion_tokens then max_tokens, on both routes; -1 (the default) generates
    # until the slot's context is full
    output_limit = OutputLimit(chat=("n_predict", "max_completion_tokens", "max_tokens"),
                               completions=("n_predict", "max_completion_tokens", "max_tokens"),
                               completions_default=None, negative_is_absent=True, stops_at_context=True,
                               source="llama.cpp tools/server/server-schema.cpp (n_predict and its aliases); "
                                      "server-context.cpp: a slot stops generating when its context is full, and "
                                      "refuses a prompt of n_ctx_slot tokens or more")
    log_signatures = (r"llama_kv_cache", r"llama_context:", r"llama_model_loader", r"llama_new_context_with_model",
                      r"llama_memory_recurrent", r"(?i:kv self size)\s*=", r"memory\.required\.kv=",  # Ollama's too
                      r"msg=\"kv cache\" device=",  # Ollama 0.11 on: each device's cache (engines/llamacpp/ollama.py)
                      r"llama_init_from_model:",  # src/llama.cpp b4500-b5400 (the renamed llama_new_context_with_model)
                      r"failed to allocate buffer for (?:kv|rs) cache",  # a refusal alone (engines/llamacpp/kvlines.py)
                      r"_model_load: (?:kv_cache )?memory[_ ]size\s*=\s*[\d.]{1,12} MB, n_mem =",  # ggml's 2023 loaders
                      r"ggml_metal_add_buffer: allocated 'kv ")  # 2023's Metal buffers (engines/llamacpp/kvlines.py)

    def pool_budget(self, model: ModelSpec, report: PoolReport, *, kv_dtype: str = "auto", tp: int = 1,
                    options: EngineOptions | None = None) -> int:
        """The pool's tokens at this engine's bytes per token."""
        return tokens_budget(self, model, report, kv_dtype, tp, options)

    def attention_backends(self, model: ModelSpec) -> tuple[str, ...]:
        """-fa on or off, as flash_attn_of reads them."""
        return ("flash", "no-flash", "on", "off", "fa")

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        self.refuse_unchecked(model, options)
        positive(tp, "tp", "tensor parallel size")
        if tp != 1:
            raise EngineRuleError("tp: llama.cpp splits layers across GPUs (its split mode), not KV heads; use 1",
                                  param="tp")
        if options.block_size is not None:
            raise EngineRuleError("block_size: llama.cpp has no KV blocks (cells are padded to 256); leave it out",
                                  param="block_size")
        dtype = self._dtype(kv_dtype, model)
        _check_block_fit(model, dtype)
        release = release_of(options)
        cell_pad = release.padding(flash_attn_of(options, release))
        swa_cells = release.swa_batch(N_UBATCH) if release.own_swa_cache else None
        groups = group_layers(_group(_as_cached(layer, model, release), dtype, cell_pad, swa_cells)
                              for layer in model.layers)
        notes = [f"llama.cpp: cells padded to {cell_pad} per slot; the memory map is `-np batch -c batch x context`",
                 *release.notes()]
        draft = options.speculative.draft if options.speculative is not None else None
        if draft is not None:  # --model-draft: a context of its own with the target's -c and -np, at -ctkd/-ctvd
            _check_block_fit(draft, _F16)
            groups += tuple(replace(g, detail=f"draft model {draft.name}: {g.detail}") for g in group_layers(
                _group(_as_cached(layer, draft, release), _F16, cell_pad, swa_cells) for layer in draft.layers))
            notes.append(f"--model-draft {draft.name}: a second cache of the same cells and slots for its "
                         f"{len(draft.layers)} layers, f16 (llama-server's default -ctkd / -ctvd, whatever -ctk)")
        if dtype.family is Family.BLOCK:
            notes.append("a quantized V cache needs flash attention (-fa on)")
        return Allocation(engine=self.name, model=model.name, kv_dtype=dtype, tp=tp, groups=groups, notes=tuple(notes))

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
        """How many slots of max_model_len tokens (`-np`, own streams) fit in kv_memory."""
        self.refuse_unchecked(model, options)
        alloc = self.allocate(model, kv_dtype, tp, options)
        release = release_of(options)
        to = release.padding(flash_attn_of(options, release))
        per_slot = alloc.sequence_bytes(max_model_len)
        slots = kv_memory // per_slot if per_slot else 0
        fits = slots >= 1
        longest = None if fits else largest_fitting(lambda n: alloc.sequence_bytes(n) <= kv_memory, max_model_len)
        if longest is not None:
            longest = longest // to * to  # n_ctx is padded up: the largest that still fits
        cells = pad(max_model_len, to) * slots
        used = alloc.kv_bytes(max(slots, 1), max_model_len)
        # whole slots: llama-server allocates -np of them up front, so 2.09 slots' worth of memory serves 2
        return Capacity(engine=self.name, kv_memory_bytes=kv_memory, num_blocks=None, block_size=to,
                        kv_cache_tokens=cells, physical_token_slots=cells, max_model_len=max_model_len,
                        max_concurrency=float(slots), fits=fits, estimated_max_model_len=longest,
                        notes=(f"llama.cpp allocates up front: -np {max(slots, 1)} -c "
                               f"{cells or pad(max_model_len, to)} (slots of {pad(max_model_len, to):,} cells) takes "
                               f"{format_bytes(used)} of this {format_bytes(kv_memory)} budget",))

    def serving(self, gpu_memory: int, max_model_len: int, options: EngineOptions = EngineOptions(),
                gpu_name: str = "", tp: int = 1, model: ModelSpec | None = None) -> Serving:
        release = release_of(options)
        flash = flash_attn_of(options, release)
        cells = pad(max_model_len, release.padding(flash))

        def compute(model: ModelSpec) -> tuple[int, str]:
            size, replayed = compute_buffer(model, cells, min(cells, N_UBATCH), 1, flash, release)
            attention = "flash attention" if flash else "no flash attention"
            if replayed:
                return size, (f"llama-server's compute buffer for {min(cells, N_UBATCH)} tokens over {cells:,} cells "
                              f"({attention}), its graph replayed through ggml's allocator: exact on the CPU "
                              "backend; on a GPU its alignment and input copies move it a little")
            return size, (f"compute buffers for n_ubatch ({N_UBATCH}) tokens, an estimate, and the KQ mask"
                          f"{'' if flash else ' and scores'} over {cells:,} cells ({attention}; from the graph: "
                          "its growth with the context is what real llama-server runs show)")

        return Serving(memory_fraction=1.0, memory_knob="all free memory", prefill_tokens=N_UBATCH,
                       prefill_note=f"compute buffers for n_ubatch ({N_UBATCH}) tokens",
                       max_num_seqs=DEFAULT_SAMPLED_ROWS, overhead_bytes=NON_TORCH_ESTIMATE,
                       overhead_note="non-torch memory", options=options, compute_buffer=compute)

    def speculative_methods(self, options: EngineOptions) -> tuple[SpecMethod, ...]:
        """--model-draft (--spec-type draft-simple) and n-gram lookup, at the build llama-cpp-python 0.3.36 vendors
        (common/speculative.cpp, tools/server/server-context.cpp there; checked against a live llama-server); older
        builds gave the draft one sequence of n_ctx / -np cells (tools/server/server.cpp), not modelled."""
        return (SpecMethod.DRAFT_MODEL, SpecMethod.NGRAM) if release_of(options).build == NEWEST_BUILD else ()

    def check_speculative(self, model: ModelSpec, spec: Speculative, options: EngineOptions) -> None:
        super().check_speculative(model, spec, options)
        if spec.draft is not None and spec.draft.draft_layers:
            raise UnsupportedArchitectureError(f"draft_model {spec.draft.name}: a draft with MTP layers of its own is "
                                               "not modelled", param="draft_model")
        if spec.draft is not None:
            from kvbudget.model.params import activation_widths

            target, draft = activation_widths(model).vocab, activation_widths(spec.draft).vocab
            if abs(target - draft) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
                raise EngineRuleError(f"draft_model {spec.draft_id or spec.draft.name}: vocab_size {draft:,}, the "
                                      f"target's {target:,}; llama-server refuses a draft whose vocabulary differs by "
                                      f"more than {SPEC_VOCAB_MAX_SIZE_DIFFERENCE} tokens (common/speculative.cpp)",
                                      param="draft_model")

    def loaded_bytes(self, model: ModelSpec, options: EngineOptions, tp: int, pp: int = 1, ep: int = 1
                     ) -> tuple[int, str] | None:
        """--model-draft's weights beside the target's (every layer on the GPU: -ngld's default)."""
        draft = options.speculative.draft if options.speculative is not None else None
        if draft is None:
            return None
        from kvbudget.model.weights import model_weights

        weights = model_weights(draft)
        return weights.per_gpu_bytes, f"draft model {draft.name}: {weights.per_gpu_bytes:,} B ({weights.basis})"

    def cheaper_kv_dtype(self, current: KVDtype) -> str | None:
        return cheaper_if_wider(current, "q8_0")

    def honours_windows(self, model: ModelSpec) -> bool:
        return model.model_type in HONOURS_WINDOW

    def parse_release(self, version: str) -> tuple[int, ...]:
        return (parse_build(version),)

    def server_buffers(self, model: ModelSpec, n_ctx: int, n_parallel: int = 1, kv_dtype: str = "auto",
                       unified: bool = False, swa_full: bool = False, n_ubatch: int = N_UBATCH,
                       release: Release = NEWEST, flash_attn: bool | None = None,
                       n_batch: int = N_BATCH) -> tuple[Buffer, ...]:
        """The caches `llama-server -c n_ctx -np n_parallel [--kv-unified] [--swa-full]` of `release` allocates."""
        kv: dict[str, list[int]] = {}
        for cached in self.layer_caches(model, n_ctx, n_parallel, kv_dtype, unified, swa_full, n_ubatch, release,
                                        flash_attn, n_batch):
            if cached is None:
                continue
            name, n, streams, k_bytes, v_bytes = cached
            entry = kv.setdefault(name, [n, streams, 0, 0, 0])
            entry[2] += 1
            entry[3] += k_bytes
            entry[4] += v_bytes
        order = ("kv", "kv_swa", "recurrent")  # the order llama.cpp creates and logs them
        return tuple(Buffer(name=name, cells=cells, streams=streams_, layers=layers, k_bytes=k_bytes, v_bytes=v_bytes)
                     for name in order if name in kv for cells, streams_, layers, k_bytes, v_bytes in [kv[name]])

    def layer_caches(self, model: ModelSpec, n_ctx: int, n_parallel: int = 1, kv_dtype: str = "auto",
                     unified: bool = False, swa_full: bool = False, n_ubatch: int = N_UBATCH,
                     release: Release = NEWEST, flash_attn: bool | None = None,
                     n_batch: int = N_BATCH) -> list[tuple[str, int, int, int, int] | None]:
        """Each layer's cache under those settings: (its buffer, cells, streams, K bytes, V bytes), or None."""
        self.refuse_unchecked(model)
        if n_ctx <= 0 or n_parallel <= 0 or n_ubatch <= 0:
            raise KVBudgetError("llama.cpp: n_ctx (-c), n_parallel (-np) and n_ubatch (-ub) must be positive")
        dtype = self._dtype(kv_dtype, model)
        _check_block_fit(model, dtype)
        to = release.padding(release.flash_attn_default if flash_attn is None else flash_attn)
        unified = unified or not release.streams  # before per-sequence streams, one stream held every sequence
        if unified:
            cells, streams = pad(n_ctx, to), 1
        elif release.pads_total_first:  # llama_context: n_ctx_seq = pad(pad(n_ctx) / np)
            cells, streams = pad(pad(n_ctx, to) // n_parallel, to), n_parallel
        else:  # create_memory: n_ctx_per_stream = pad(ceil(n_ctx / np))
            cells, streams = pad(cdiv(n_ctx, n_parallel), to), n_parallel
        swa_cells = cells if swa_full else None
        swa_batch = release.swa_batch(n_ubatch, n_batch)
        return [_layer_cache(_as_cached(layer, model, release), dtype, cells, streams, n_parallel, unified,
                             swa_cells, swa_batch, to) for layer in model.layers]

    def offload(self, model: ModelSpec, gpu_memory: int, max_model_len: int, kv_dtype: str = "auto",
                options: EngineOptions = EngineOptions()) -> Offload | None:
        """`-ngl N`: the output and the last N - 1 layers on the GPU with their caches (one slot of max_model_len)
        and the compute buffer; see offload.py."""
        from kvbudget.engines.llamacpp.offload import fit_layers

        release = release_of(options)
        flash = flash_attn_of(options, release)
        cells = pad(max_model_len, release.padding(flash))
        compute, _ = compute_buffer(model, cells, min(cells, N_UBATCH), 1, flash, release)
        caches = [0 if c is None else c[3] + c[4] for c in self.layer_caches(
            model, max_model_len, 1, kv_dtype, release=release, flash_attn=flash)]
        return fit_layers(model, gpu_memory, caches, compute + NON_TORCH_ESTIMATE)

    def slot_context(self, model: ModelSpec, context: int, n_parallel: int, unified: bool = False) -> tuple[int, int]:
        """`llama-server -np n_parallel -c n_parallel x context [--kv-unified]`: (n_ctx_slot, the cells of the
        shared pool, 0 with a stream per slot). n_ctx is padded to 256 cells, each stream to 256 more
        (llama_context: n_ctx_seq); a slot's context is capped at the model's training length."""
        n_ctx = pad(n_parallel * context)
        per_seq = n_ctx if unified else pad(n_ctx // n_parallel)
        trained = model.max_position_embeddings or per_seq
        return min(per_seq, trained), n_ctx if unified else 0

    def _dtype(self, kv_dtype: str, model: ModelSpec) -> KVDtype:
        if str(kv_dtype).lower() == "auto":
            return _F16  # llama-server's default -ctk/-ctv f16, whatever the weights
        dtype = resolve_kv_dtype(kv_dtype, model.dtype)
        if dtype.name not in CACHE_TYPES:
            raise EngineRuleError(f"kv_dtype {kv_dtype}: llama.cpp cache types are f32, f16, bf16, q8_0, q4_0, "
                                  "q4_1, q5_0, q5_1 and iq4_nl", param="kv_dtype")
        return dtype

    def compute_buffer(self, model: ModelSpec, cells: int, n_tokens: int, n_parallel: int, flash: bool,
                       release: Release = NEWEST, quantized: bool = False, unified: bool = False) -> tuple[int, bool]:
        """llama-server's compute buffer and whether it is replayed from the graph: see `compute_buffer`."""
        return compute_buffer(model, cells, n_tokens, n_parallel, flash, release, quantized, unified)

    offload_backends = ("prompt cache",)

    def host_tiers(self, model: ModelSpec, *, memory: int, disk: int | None, backend: str, kv_dtype: str, tp: int,
                   options: EngineOptions) -> tuple[HostTier, ...]:
        """llama-server's host-RAM prompt cache (`--cache-ram` MiB, 8,192 by default; tools/server, the
        server_prompt_cache): whole slot caches, sized by their tokens' KV bytes (plus a small header: an
        estimate), which `simulate` follows (engines/llamacpp/scheduler.py)."""
        no_disk("llamacpp", "prompt cache", disk, "it keeps slot caches in RAM only")
        per_token = self.allocate(model, kv_dtype, tp, options).bytes_per_token
        mib = memory // MIB
        if not mib:
            raise EngineRuleError("offload_memory: llama-server's prompt cache (cache_ram) is whole MiB; give at "
                                  "least 1 MiB", param="offload_memory")
        units = mib * MIB // per_token
        return (HostTier(engine=self.name, backend="prompt cache", medium="host memory", setting=f"--cache-ram {mib}",
                         unit="token", unit_tokens=1, unit_bytes=per_token, units=units, ranks=1,
                         host_bytes=units * per_token, pinned=False, partial_units=True,
                         policy="oldest saved prompt first, past the size limit",
                         movement="a slot's cache is saved when the slot takes a new task; the saved one that keeps "
                                  "most of itself and covers most of a new prompt is loaded back into the slot",
                         source="llama.cpp tools/server (server_prompt_cache), as simulate follows it",
                         notes=("the cache holds whole prompts; a saved prompt larger than the cache is not kept",)),)


def _check_block_fit(model: ModelSpec, dtype: KVDtype) -> None:
    """llama.cpp refuses a block type whose block does not divide the head dim (llama_init_from_model)."""
    if dtype.block_values == 1:
        return
    for layer in model.layers:
        if isinstance(layer, LatentAttention):
            dims = [layer.values_per_token, layer.latent_dim]  # K row, and the latent V view
        elif isinstance(layer, Attention):
            dims = [layer.k_dim, layer.v_dim]
        else:
            continue
        for dim in dims:
            if dim % dtype.block_values:
                raise EngineRuleError(f"kv_dtype {dtype.name}: llama.cpp needs the head dim ({dim}) to be a multiple "
                                      f"of the {dtype.block_values}-value block; choose f16, bf16 or f32",
                                      param="kv_dtype")


def _state_buffer(layer: RecurrentState, dtype: KVDtype, cells: int, streams: int, n_parallel: int, unified: bool,
                  swa_cells: int | None, swa_batch: int, to: int) -> tuple[str, int, int, int, int]:
    r, s_ = _recurrent_rows(layer)
    slots = max(1, n_parallel)
    return "recurrent", slots, 1, _F32.bytes_for(r) * slots, _F32.bytes_for(s_) * slots


def _kv_buffer(layer: Attention | LatentAttention, dtype: KVDtype, cells: int, streams: int, n_parallel: int,
               unified: bool, swa_cells: int | None, swa_batch: int, to: int) -> tuple[str, int, int, int, int]:
    k, v = _kv_rows(layer)
    return "kv", cells, streams, dtype.bytes_for(k) * cells * streams, dtype.bytes_for(v) * cells * streams if v else 0


def _swa_buffer(layer: SlidingWindow | ChunkedLocal, dtype: KVDtype, cells: int, streams: int, n_parallel: int,
                unified: bool, swa_cells: int | None, swa_batch: int, to: int) -> tuple[str, int, int, int, int]:
    n = swa_cells or _window_cells(layer, cells, swa_batch, to, n_parallel if unified else 1)
    k, v = _kv_rows(layer)
    return "kv_swa", n, streams, dtype.bytes_for(k) * n * streams, dtype.bytes_for(v) * n * streams if v else 0


# One layer's cache as llama.cpp keeps it, by the layer's kind: (its buffer, cells, streams, K bytes, V bytes), or
# None; (layer, dtype, cells, streams, n_parallel, unified, swa_cells, swa_batch, to)
_layer_cache: KindTable[tuple[str, int, int, int, int] | None] = KindTable("llamacpp", {
    Attention: _kv_buffer, SlidingWindow: _swa_buffer, ChunkedLocal: _swa_buffer, LatentAttention: _kv_buffer,
    RecurrentState: _state_buffer, IndexerKeys: no_cache, NoCache: no_cache})


def _window_cells(layer: SlidingWindow | ChunkedLocal, cells: int, swa_batch: int, to: int, sequences: int = 1) -> int:
    """Cells of a sliding or chunked cache: the window of each sequence it holds plus a batch, padded, at most the
    full cache's (llama.cpp's chunks are 8192 whatever the config says)."""
    span = layer.window if isinstance(layer, SlidingWindow) else LLAMA4_CHUNK
    return min(cells, pad(span * sequences + swa_batch, to))


def _as_cached(layer: LayerSpec, model: ModelSpec, release: Release) -> LayerSpec:
    """The layer as llama.cpp caches it: windows it does not honour (any, before the build had an SWA cache)
    become full attention."""
    if isinstance(layer, IndexerKeys):
        _indexer_refused(layer, where=model.name)
    if isinstance(layer, (SlidingWindow, ChunkedLocal)) and (model.model_type not in HONOURS_WINDOW
                                                             or not release.own_swa_cache):
        return FullAttention(layer.layer, layer.kv_heads, layer.k_dim, layer.v_dim)
    return layer


def _kv_rows(layer: Attention | LatentAttention) -> tuple[int, int]:
    """Values per cell in the K and V rows of one layer (MLA: one K row, no V)."""
    if isinstance(layer, LatentAttention):
        return layer.values_per_token, 0
    return layer.kv_values(1, "")


def _recurrent_rows(layer: RecurrentState) -> tuple[int, int]:
    """Values per sequence in the r (conv) and s (SSM) rows of one recurrent layer."""
    channels, _, state = layer.per_rank(1, "")
    return (layer.conv_kernel - 1) * channels, state


def _attention_group(layer: Attention, dtype: KVDtype, to: int, swa_batch: int | None) -> CacheGroup:
    """One layer's cache per slot: cells padded to `to`."""
    k, v = _kv_rows(layer)
    return CacheGroup(kind=layer.kind, layers=1, bytes_per_token=dtype.bytes_for(k) + dtype.bytes_for(v),
                      detail=layer.describe(1, "", dtype.name), block_size=to)


def _sliding_group(layer: SlidingWindow, dtype: KVDtype, to: int, swa_batch: int | None) -> CacheGroup:
    """A window's cache holds window + swa_batch cells."""
    group = _attention_group(layer, dtype, to, swa_batch)
    if swa_batch is None:
        return group
    cap = pad(layer.window + swa_batch, to)
    return replace(group, token_cap=cap, detail=group.detail + f", window {layer.window}: {cap} cells per slot")


def _chunked_group(layer: ChunkedLocal, dtype: KVDtype, to: int, swa_batch: int | None) -> CacheGroup:
    """llama4.cpp keeps chunked layers in the SWA cache, n_swa 8192."""
    group = _attention_group(layer, dtype, to, swa_batch)
    if swa_batch is None:
        return group
    cap = pad(LLAMA4_CHUNK + swa_batch, to)
    return replace(group, token_cap=cap,
                   detail=group.detail + f", chunked (llama.cpp uses {LLAMA4_CHUNK}): {cap} cells per slot")


def _latent_group(layer: LatentAttention, dtype: KVDtype, to: int, swa_batch: int | None) -> CacheGroup:
    return CacheGroup(kind=layer.kind, layers=1, bytes_per_token=dtype.bytes_for(layer.values_per_token),
                      detail=f"K row of {layer.latent_dim} + {layer.rope_dim} x {dtype.name}, no V", block_size=to)


def _state_group(layer: RecurrentState, dtype: KVDtype, to: int, swa_batch: int | None) -> CacheGroup:
    r, state = _recurrent_rows(layer)
    fixed = _F32.bytes_for(r) + _F32.bytes_for(state)
    return CacheGroup(kind=layer.kind, layers=1, bytes_per_token=0, fixed_bytes=fixed,
                      detail=f"{layer.mixer}: r {layer.conv_kernel - 1} x "
                      f"{layer.conv_channels} + s {'x'.join(map(str, layer.state_shape))}, f32, one cell per "
                             "sequence", block_size=to)


def _indexer_refused(layer: IndexerKeys, *args: object, where: str = "this model") -> None:
    raise UnsupportedArchitectureError(f"{where}: llama.cpp keeps DeepSeek-V3.2's indexer keys in a cache of its own "
                                       "(llama-kv-cache-dsa.cpp), which kvbudget does not model yet; use the vllm or "
                                       "hf engine")


# One layer's cache per slot, by the layer's kind (as llama.cpp caches it: `_as_cached`):
# (layer, dtype, to, swa_batch) -> group or None
_group: KindTable[CacheGroup | None] = KindTable("llamacpp", {
    Attention: _attention_group, SlidingWindow: _sliding_group, ChunkedLocal: _chunked_group,
    LatentAttention: _latent_group, RecurrentState: _state_group, IndexerKeys: _indexer_refused, NoCache: no_cache})
LlamaCppEngine.layer_kinds = _group.kinds

