"""The engine seam: what every engine answers, what it returns, and the rules engines share.

An engine turns a ModelSpec into an Allocation: groups of layers it stores alike, each with bytes per token, the
most tokens a sequence keeps there, and fixed bytes per sequence. It also owns every other fact about itself that
kvbudget uses: its serving defaults on a GPU, how it splits pipeline stages, the cheaper KV dtype it offers, whether
it honours windows, its usage gauge, how it counts a prompt, and its startup log. Everything downstream (estimate,
plan, tokens, guard, alerts, check-log) asks the engine and never keeps an engine list or an engine branch of its
own. A new engine subclasses `Engine`, implements `allocate()` and `capacity()`, overrides the facts that differ
from the defaults here, and registers itself (`kvbudget.engines.register`)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, runtime_checkable

from kvbudget.choices import Device, EntryPoint
from kvbudget.dtypes import Family, KVDtype, resolve_kv_dtype
from kvbudget.engines.freecap import FreeMemoryCap
from kvbudget.errors import EngineRuleError, UnsupportedArchitectureError, named
from kvbudget.model.spec import (
    Attention,
    IndexerKeys,
    LatentAttention,
    LayerSpec,
    ModelSpec,
    NoCache,
    RecurrentState,
)
from kvbudget.units import GIB, cdiv
from kvbudget.validate import positive, shown

if TYPE_CHECKING:
    from kvbudget.model.weights import Weights
    from kvbudget.speculative import SpecMethod, Speculative

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """The knobs that change what an engine allocates; None means the engine's own default."""

    block_size: int | None = None  # tokens per block / page
    max_num_batched_tokens: int | None = None  # vLLM: tokens in flight per step
    prefix_caching: bool = True
    device: Device = Device.CUDA  # vLLM's CPU backend differs in block size and state dtype
    # vLLM's hybrid KV cache manager (on since 0.9; --disable-hybrid-kv-cache-manager turns it off): without it
    # sliding-window and chunked layers are sized as full attention
    hybrid_allocator: bool = True
    engine_version: tuple[int, ...] | None = None  # the release modelled: vLLM (major, minor), llama.cpp (build,)
    attention_backend: str | None = None  # vLLM: MLA backend (FLASHMLA, ...); llama.cpp: flash or no-flash (-fa)
    compute_capability: str | None = None  # the GPU's ("9.0"), where the engine's choices depend on it
    kv_cache_dtype: str | None = None  # the plan's kv_dtype (set by plan): it picks kernels (vLLM's attention)
    pp_layer_partition: tuple[int, ...] | None = None  # layers per pipeline stage (vLLM's VLLM_PP_LAYER_PARTITION)
    # Speculative decoding with the model's own MTP layers (vLLM's speculative_config method "mtp"): drafted a step
    num_speculative_tokens: int = 0
    speculative: Speculative | None = None  # as asked (--speculative); each engine sizes the drafters it runs
    # vLLM: sequences one step holds at most (--max-num-seqs: the profiling sampler's rows and the CUDA-graph
    # capture sizes follow it); None is the release's default for the GPU
    max_num_seqs: int | None = None
    enforce_eager: bool = False  # vLLM --enforce-eager: no CUDA graphs are captured, so none are budgeted
    flashinfer_sampler: bool = False  # vLLM 0.9-0.11 sampling on FlashInfer where installed (engines/vllm/sampler.py)
    entry_point: EntryPoint = EntryPoint.SERVER  # vLLM: vllm serve or the Python LLM class (batch defaults differ)
    # vLLM --enable-lora with --max-loras slots of --max-lora-rank (vLLM's defaults 1 and 16): LoRA buffers beside
    # the weights
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    extensible_kv_cache: bool = True  # vLLM >= 0.34: cache sized after warm-up (--no-enable-extensible-kv-cache)


@dataclass(frozen=True, kw_only=True)
class CacheGroup:
    """Layers of one kind that an engine stores alike (numbers per layer, on the most loaded GPU)."""

    kind: str  # the layer kind's label (model.spec), or the kind the engine stores it as
    layers: int  # including padding layers an engine allocates for alignment
    bytes_per_token: int  # per layer, per cached token (per stored state in a CompressedGroup)
    token_cap: int | None = None  # the most tokens one sequence keeps per layer; None = grows with context
    fixed_bytes: int = 0  # per layer, per sequence, whatever the context
    detail: str  # how the per-token and fixed figures are made up, for people
    block_size: int = 1  # tokens are held in whole blocks of this many

    def tokens_held(self, context: int, capped: bool = True) -> int:
        held = cdiv(context, self.block_size) * self.block_size
        return held if self.token_cap is None or not capped else min(held, self.token_cap)

    def sequence_bytes(self, context: int, capped: bool = True) -> int:
        return self.layers * (self.bytes_per_token * self.tokens_held(context, capped) + self.fixed_bytes)

    @property
    def period(self) -> int:
        """Tokens one stored entry stands for (1: every token its own)."""
        return 1

    @property
    def token_tax(self) -> int:
        """Bytes per token per layer as the context grows."""
        return self.bytes_per_token

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "layers": self.layers, "bytes_per_token_per_layer": self.token_tax,
                "token_cap": self.token_cap, "fixed_bytes_per_layer": self.fixed_bytes, "detail": self.detail}


@dataclass(frozen=True, kw_only=True)
class CompressedGroup(CacheGroup):
    """A compressed cache (DeepSeek-V4): one state stands for `tokens_per_state` tokens; the tokens of a state not
    yet complete cost `pending_bytes_per_token` each, and `primed_bytes` are held once the first state is complete."""

    tokens_per_state: int = 1
    pending_bytes_per_token: int = 0
    primed_bytes: int = 0

    def sequence_bytes(self, context: int, capped: bool = True) -> int:
        if self.tokens_per_state == 1:
            return super().sequence_bytes(context, capped)
        held = self.tokens_held(context, capped)
        states = held // self.tokens_per_state
        return self.layers * (self.bytes_per_token * states + self.fixed_bytes
                              + self.pending_bytes_per_token * (held % self.tokens_per_state)
                              + (self.primed_bytes if states else 0))

    @property
    def period(self) -> int:
        return self.tokens_per_state

    @property
    def token_tax(self) -> int:
        """A state's bytes spread over its tokens."""
        return self.bytes_per_token // self.tokens_per_state

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.tokens_per_state > 1:
            out.update(tokens_per_state=self.tokens_per_state, bytes_per_state_per_layer=self.bytes_per_token,
                       pending_bytes_per_token_per_layer=self.pending_bytes_per_token,
                       primed_bytes_per_layer=self.primed_bytes)
        return out


def count_alike(items: Iterable[K | None]) -> dict[K, int]:
    """How many times each item occurs, in first-seen order (None skipped)."""
    counts: dict[K, int] = {}
    for item in items:
        if item is not None:
            counts[item] = counts.get(item, 0) + 1
    return counts


def group_layers(per_layer: Iterable[CacheGroup | None]) -> tuple[CacheGroup, ...]:
    """One CacheGroup per distinct group of one layer each (`layers=1`), with the layers counted, in order."""
    counts = count_alike(per_layer)
    return tuple(group if n == group.layers else replace(group, layers=n * group.layers) for group, n in counts.items())


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """What one engine holds for one model, KV dtype and parallel layout."""

    engine: str
    model: str
    kv_dtype: KVDtype
    tp: int
    groups: tuple[CacheGroup, ...]
    exact: bool = True
    notes: tuple[str, ...] = ()
    # sequence_bytes by (context, capped): planners, sweeps and the guard ask for the same lengths again and again
    _memo: dict[tuple[int, bool], int] = field(default_factory=dict, init=False, repr=False, compare=False,
                                               hash=False)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one sequence adds per token before any window cap."""
        return sum(g.layers * g.token_tax for g in self.groups)

    @property
    def fixed_bytes_per_sequence(self) -> int:
        """Bytes one sequence holds whatever its length (recurrent state)."""
        return sum(g.layers * g.fixed_bytes for g in self.groups)

    def sequence_bytes(self, context: int, capped: bool = True) -> int:
        """Bytes one sequence of `context` tokens holds; `capped=False` ignores windows and chunks."""
        memo = self._memo
        held = memo.get((context, capped))
        if held is None:
            if len(memo) >= 4096:
                memo.clear()
            held = memo[context, capped] = sum(g.sequence_bytes(context, capped) for g in self.groups)
        return held

    def kv_bytes(self, sequences: int, context: int, capped: bool = True) -> int:
        """Bytes `sequences` sequences of `context` tokens each hold."""
        return sequences * self.sequence_bytes(context, capped)


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """What an engine makes of a KV budget, in its own definitions."""

    engine: str
    kv_memory_bytes: int
    num_blocks: int | None  # None where the engine has no blocks
    block_size: int | None
    kv_cache_tokens: int  # the figure the engine prints
    physical_token_slots: int  # tokens that physically fit in every layer group at once
    max_model_len: int
    max_concurrency: float  # requests of max_model_len tokens that fit at once
    fits: bool  # one request of max_model_len fits
    estimated_max_model_len: int | None  # the longest request that fits, when one of max_model_len does not
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        keys = ("kv_memory_bytes", "num_blocks", "block_size", "kv_cache_tokens", "physical_token_slots",
                "max_model_len", "max_concurrency", "fits", "estimated_max_model_len")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True, kw_only=True)
class Serving:
    """How an engine serves on one GPU with its defaults: the planner's inputs, each with where it comes from."""

    memory_fraction: float  # the share of GPU memory the engine takes
    memory_knob: str  # the engine's name for that share, for people
    prefill_tokens: int  # tokens of the largest forward pass it plans for (0: activations outside its share)
    prefill_note: str
    max_num_seqs: int  # sequences one step samples (float32 logits in the profiling run)
    overhead_bytes: int  # non-torch memory and captured graphs: an estimate
    overhead_note: str
    options: EngineOptions  # the options with this engine's defaults for this GPU filled in
    logit_bytes: int = 4  # bytes the profiling run's sampler holds per logit (rows x vocabulary) at its peak
    sampler_apart: bool = False  # the sampler runs after the forward pass has freed its activations (peak: the larger)
    held_bytes: int = 0  # what the forward pass keeps allocated through the sampler (vLLM's fused-MoE workspace)
    forward_values: tuple[int, int] = (4, 2)  # values per token at the forward pass's peak: (hidden-, MLP-wide)
    encoder_peak_bytes: int = 0  # a pass profiled before the text's, whose peak may be the higher (vLLM's encoder)
    # the engine's own figure for its forward pass's buffers (llama.cpp's compute buffer), in place of the
    # estimate from prefill_tokens: bytes for a model and how they were found (on a GPU, still an estimate)
    compute_buffer: Callable[[ModelSpec], tuple[int, str]] | None = None
    # memory in use before the engine measures what is free (SGLang): its share of it comes off the budget too
    preload_bytes: int = 0
    given_fraction_scale: float = 1.0  # what the engine multiplies a share you give by (SGLang 0.4, multimodal)
    # the part of what its share leaves free after the profiling pass the engine keeps for the cache (TGI before
    # 3.0: 0.95 or 0.90); the rest stays unused
    free_share: float = 1.0
    free_cap: FreeMemoryCap | None = None  # the most of the card the engine's share can take (vLLM 0.34)


@dataclass(frozen=True, kw_only=True)
class Offload:
    """Part of a model on the GPU, the rest in host memory: the engine's setting that says how much, in its own
    parameter name and value, and the bytes on each side."""

    parameter: str  # the engine's own setting (llama-server's n_gpu_layers)
    value: int
    of: int  # the value that would put everything on the GPU
    gpu_bytes: int  # weights, caches and buffers on the GPU
    host_bytes: int  # weights and caches left in host memory
    note: str


@dataclass(frozen=True, kw_only=True)
class UsageGauge:
    """Where a running engine publishes its KV usage and how to read it as a 0..1 fraction."""

    path: str  # "/metrics" (Prometheus text) or "/slots" (llama-server's JSON)
    read: Callable[[str], float | None]  # the body of `path` -> usage, or None when it holds no figure
    promql: str  # the same usage as a PromQL expression per instance, for alert rules
    health_path: str | None = None  # when `path` may be disabled: the liveness endpoint to try
    series: str | None = None  # the one gauge `promql` reads (for simulated series); None where it is a ratio
    by: str = "instance"  # the label `promql` keeps: one alert per value of it


@dataclass(frozen=True)
class LogRow:
    quantity: str
    logged: str
    predicted: str
    matches: bool | None  # None: shown beside the log, not a check (an estimate's term)
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class LogCheck:
    """An engine's startup log beside kvbudget's prediction for the same settings."""

    engine: str
    model_in_log: str | None  # the model path or name the log names
    settings: dict[str, Any]  # read from the log, or given by the user
    rows: tuple[LogRow, ...]
    assumed: dict[str, Any] = field(default_factory=dict)  # settings the log does not state: the engine's default
    causes: tuple[str, ...] = ()  # when rows differ: what would make them agree, most likely first

    @property
    def all_match(self) -> bool:
        return all(r.matches is not False for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "model_in_log": self.model_in_log, "settings": self.settings,
                "assumed": self.assumed, "all_match": self.all_match, "rows": [r.__dict__ for r in self.rows],
                "likely_causes": list(self.causes)}


# Estimates used where an engine's figure is not known exactly (each labelled "estimate" where it is shown,
# each overridable in plan()): CUDA context, cuBLAS workspaces and NCCL buffers outside torch's allocator, for
# engines without a measured figure (vLLM's are in engines/vllm/memory.py).
NON_TORCH_ESTIMATE = GIB // 2
# Rows of float32 logits the largest forward pass keeps (vLLM's profiling run samples max_num_seqs sequences; 256
# is its default below 70 GiB). Engines without a figure of their own use the same: an estimate.
DEFAULT_SAMPLED_ROWS = 256


@dataclass(frozen=True, kw_only=True)
class OutputLimit:
    """How an engine's server reads a request's output limit: its fields, first present first (the guard's rule)."""

    chat: tuple[str, ...]  # /v1/chat/completions fields, in the order the engine prefers them
    completions: tuple[str, ...]  # /v1/completions fields
    completions_default: int | None  # an absent limit on /v1/completions; None: up to the end of the context
    zero_is_absent: bool = False  # the engine reads `a or b`: a 0 falls through to the next field
    negative_is_absent: bool = False  # llama.cpp: -1 asks for no limit
    stops_at_context: bool = False  # a limit past the context is cut there, not refused (llama.cpp's slot)
    source: str = ""

    def tokens(self, body: dict[str, Any], chat: bool, remaining: int | None) -> int | None:
        """Output tokens a (validated) request may generate with `remaining` tokens of context left (None: not
        known, and then None for a request that sets no limit)."""
        asked: int | None = None
        for name in self.chat if chat else self.completions:
            value = body.get(name)
            if value is None or (self.zero_is_absent and value == 0) or (self.negative_is_absent and value < 0):
                continue
            asked = value
            break
        if asked is None and not chat:
            asked = self.completions_default
        if asked is None:
            return None if remaining is None else max(0, remaining)
        return max(0, asked if remaining is None else min(asked, remaining))


# OpenAI's own API: max_completion_tokens replaced max_tokens on chat; completions default to 16 tokens
OPENAI_OUTPUT_LIMIT = OutputLimit(chat=("max_completion_tokens", "max_tokens"), completions=("max_tokens",),
                                  completions_default=16,
                                  source="the OpenAI API reference")


@dataclass(frozen=True)
class Engine:
    """The base every engine derives from: the defaults here hold for an engine that is a library, not a server.

    Subclasses set `name` and `description` and implement `allocate()` and `capacity()`."""

    name: str = "engine"
    description: str = ""

    log_signatures: ClassVar[tuple[str, ...]] = ()  # regexes that identify this engine's startup log
    serves: ClassVar[bool] = False  # a server with metrics and a memory fraction (not a library)
    prompt_adds_bos: ClassVar[bool] = False  # adds the vocabulary's BOS before the rendered chat prompt
    usage: ClassVar[UsageGauge | None] = None
    queue_gauges: ClassVar[tuple[str, str] | None] = None  # its /metrics gauges of requests (running, waiting)
    output_limit: ClassVar[OutputLimit] = OPENAI_OUTPUT_LIMIT  # how its server reads a request's output limit
    # Families this engine runs whose cache kvbudget has not checked against the engine's own code: model_type ->
    # what is not known. They are refused rather than sized by the general rules.
    unchecked_families: ClassVar[dict[str, str]] = {}
    reports_kv_size: ClassVar[bool] = True  # prints its KV cache size at start-up (transformers prints nothing)
    expert_parallel: ClassVar[bool] = False  # spreads an MoE's experts over data-parallel attention ranks

    # The layer kinds this engine's allocate() sizes; a model with any other is refused by refuse_unchecked()
    layer_kinds: ClassVar[tuple[type[LayerSpec], ...]] = (Attention, LatentAttention, IndexerKeys, RecurrentState,
                                                          NoCache)

    speculative: ClassVar[bool] = False  # sizes the caches speculative decoding adds (num_speculative_tokens)
    # its budget follows max_num_seqs, enforce_eager and entry_point (a profiling pass that samples max_num_seqs rows,
    # CUDA graphs it can leave out, batch defaults by how it is started)
    profiles_batch: ClassVar[bool] = False

    def attention_backends(self, model: ModelSpec) -> tuple[str, ...]:
        """What `attention_backend` may name for `model` on this engine (none: the engine takes no such setting)."""
        return ()

    def check_attention_backend(self, model: ModelSpec, backend: str) -> None:
        """Refuse a backend this engine does not take for `model` (the names compare without case)."""
        known = self.attention_backends(model)
        if backend.upper() not in (k.upper() for k in known):
            takes = f"one of {', '.join(known)}" if known else f"none for {model.name}; leave it out"
            raise EngineRuleError(f"attention_backend {shown(backend)}: kvbudget's {self.name} takes {takes}",
                                  param="attention_backend")

    def refuse_unchecked(self, model: ModelSpec, options: EngineOptions | None = None) -> None:
        """Raise for a family in `unchecked_families`, or a layer of a kind this engine does not size, or options it
        does not model: no figure rather than an unverified one."""
        if options is not None and options.attention_backend is not None:
            self.check_attention_backend(model, options.attention_backend)
        if options is not None and options.num_speculative_tokens and not self.speculative:
            raise EngineRuleError(f"num_speculative_tokens: speculative decoding's caches are modelled for vLLM only, "
                                  f"not {self.name}; leave it out", param="num_speculative_tokens")
        if options is not None and options.speculative is not None:
            self.check_speculative(model, options.speculative, options)
        if options is not None and not self.profiles_batch:
            asked = (("max_num_seqs", options.max_num_seqs), ("enforce_eager", options.enforce_eager),
                     ("entry_point", options.entry_point != EntryPoint.SERVER), ("enable_lora", options.enable_lora),
                     ("flashinfer_sampler", options.flashinfer_sampler),
                     ("extensible_kv_cache", not options.extensible_kv_cache))
            if knob := next((name for name, on in asked if on), None):
                raise EngineRuleError(f"{named(knob, value=False) if knob == 'extensible_kv_cache' else knob}: a vLLM "
                                      f"setting kvbudget models for vLLM only, not {self.name}; leave it out",
                                      param=knob)
        if why := self.unchecked_families.get(model.model_type):
            raise UnsupportedArchitectureError(f"{model.name}: {why}, so kvbudget does not size it for "
                                               f"{self.name} yet; use the vllm or hf engine")
        other = next((s for s in model.layers if not isinstance(s, self.layer_kinds)), None)
        if other is not None:
            raise UnsupportedArchitectureError(
                f"{model.name}: layer {other.layer} keeps a {other.kind} cache ({type(other).__name__}), which "
                f"kvbudget does not size for {self.name} yet; the hf engine sizes it")

    def speculative_methods(self, options: EngineOptions) -> tuple[SpecMethod, ...]:
        """The speculative methods whose drafter memory kvbudget sizes for this engine and release (none here)."""
        return ()

    def check_speculative(self, model: ModelSpec, spec: Speculative, options: EngineOptions) -> None:
        """Refuse a method this engine and release do not run (engines that run some add their own rules)."""
        methods = self.speculative_methods(options)
        if spec.method not in methods:
            takes = f"takes {', '.join(methods)}" if methods else "takes none"
            raise EngineRuleError(f"speculative {spec.method}: kvbudget's {self.name} (this release) {takes}; give "
                                  "another method or engine", param="speculative")

    def lookahead_slots(self, options: EngineOptions) -> int:
        """KV slots each running request holds beyond its own tokens for speculative decoding (none here)."""
        return 0

    # --- memory -------------------------------------------------------------------------------------
    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        raise NotImplementedError

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
        raise NotImplementedError

    def pipeline_stages(self, num_layers: int, pp: int, partition: tuple[int, ...] | None = None) -> list[range]:
        """Layers per pipeline stage; engines that do not split layers this way refuse pp > 1."""
        positive(pp, "pp", "pipeline parallel size")
        if partition is not None:
            raise EngineRuleError(f"pp_layer_partition: {self.name} takes no layer partition (vLLM's "
                                  "VLLM_PP_LAYER_PARTITION)", param="pp_layer_partition")
        if pp != 1:
            raise EngineRuleError(f"pp: kvbudget models pipeline parallelism for engines that split layers into "
                                  f"stages, not {self.name}", param="pp")
        return [range(num_layers)]

    def parse_release(self, version: str) -> tuple[int, ...]:
        """EngineOptions.engine_version for `version` ("0.8.5"); engines that model one release refuse others."""
        raise EngineRuleError(f"engine_version {version}: kvbudget models one release of {self.name}; give the "
                              "engine without a version", param="engine_version")

    def checked_model(self, model: ModelSpec, stage: ModelSpec, options: EngineOptions = EngineOptions()
                      ) -> ModelSpec:
        """What the engine's start-up check weighs against one rank's budget under pipeline parallelism: the
        rank's own `stage` (vLLM 0.14-0.16 weighed the whole `model`)."""
        return stage

    def loaded_bytes(self, model: ModelSpec, options: EngineOptions, tp: int, pp: int = 1, ep: int = 1
                     ) -> tuple[int, str] | None:
        """Memory the engine allocates beside the weights while it loads them (vLLM's rotary tables, LoRA slots and
        MXFP4 layout) on the most loaded rank of tp x pp (experts over tp x `ep`), and how; None where none is known."""
        return None

    def as_loaded(self, weights: Weights, model: ModelSpec, options: EngineOptions, tp: int, pp: int = 1,
                  ep: int = 1) -> Weights:
        """`weights` per GPU with `loaded_bytes` added, as the engine's start-up log counts them."""
        extra = self.loaded_bytes(model, options, tp, pp, ep)
        return weights if extra is None else replace(weights, per_gpu_bytes=weights.per_gpu_bytes + extra[0],
                                                     basis=f"{weights.basis}; {extra[1]}")

    # --- serving ------------------------------------------------------------------------------------
    def serving(self, gpu_memory: int, max_model_len: int, options: EngineOptions = EngineOptions(),
                gpu_name: str = "", tp: int = 1, model: ModelSpec | None = None) -> Serving:
        """Defaults on a GPU of `gpu_memory` bytes (for `model`, where the engine's defaults depend on it). A library
        takes what is free and runs the prompt whole."""
        tokens = min(max_model_len, 4096)
        return Serving(memory_fraction=1.0, memory_knob="all free memory", prefill_tokens=tokens,
                       prefill_note=f"a prompt of {tokens} tokens in one forward pass",
                       max_num_seqs=DEFAULT_SAMPLED_ROWS, overhead_bytes=NON_TORCH_ESTIMATE,
                       overhead_note="non-torch memory", options=options)

    def cheaper_kv_dtype(self, current: KVDtype) -> str | None:
        """A KV dtype this engine stores in fewer bytes than `current`, or None."""
        return None

    def offload(self, model: ModelSpec, gpu_memory: int, max_model_len: int, kv_dtype: str = "auto",
                options: EngineOptions = EngineOptions()) -> Offload | None:
        """For an engine that can keep part of the model in host memory: how much of it fits on a GPU of
        `gpu_memory` bytes with one request of `max_model_len` tokens; None where it cannot (the default)."""
        return None

    def honours_windows(self, model: ModelSpec) -> bool:
        """Whether sliding-window and chunked layers keep only their window here (else cached in full)."""
        return True

    # --- capabilities (and `kvbudget.engines.scheduling.Simulates`: a scheduler model for simulate) -----------
    def reads_log(self, text: str) -> bool:
        """Whether `text` is this engine's startup log (an engine that reads logs is also `ReadsLogs`)."""
        return any(re.search(p, text) for p in self.log_signatures)


@runtime_checkable
class ReadsLogs(Protocol):
    """An engine whose startup logs check-log reads."""

    def reads_log(self, text: str) -> bool:
        """Whether `text` is this engine's startup log."""

    def check_log(self, text: str, model: ModelSpec, given: Mapping[str, Any] | None = None) -> LogCheck:
        """The log's KV figures beside kvbudget's; `given`: settings the user states that the log does not."""


def simple_capacity(alloc: Allocation, kv_memory: int, max_model_len: int, note: str) -> Capacity:
    """Capacity of an engine without a block pool: whole sequences of max_model_len in the budget."""
    per_request = alloc.sequence_bytes(max_model_len)
    concurrency = kv_memory / per_request if per_request else float("inf")
    fits = per_request <= kv_memory
    longest = None
    if not fits:
        def ok(n: int) -> bool:
            return alloc.sequence_bytes(n) <= kv_memory

        # A compressor's open window makes the bytes rise and fall within each period of its states' tokens; at
        # whole periods they only grow, and within a period they never fall below its start: find the last period
        # that starts within the budget, then the last length in it that fits.
        period = math.lcm(*(g.period for g in alloc.groups))
        if period == 1:
            longest = largest_fitting(ok, max_model_len)
        else:
            start = period * largest_fitting(lambda k: ok(k * period), max_model_len // period)
            longest = max((n for n in range(max(start, 1), min(max_model_len, start + period - 1) + 1) if ok(n)),
                          default=0)
    slots = kv_memory // alloc.bytes_per_token if alloc.bytes_per_token else 0
    return Capacity(engine=alloc.engine, kv_memory_bytes=kv_memory, num_blocks=None, block_size=None,
                    kv_cache_tokens=int(concurrency * max_model_len), physical_token_slots=slots,
                    max_model_len=max_model_len, max_concurrency=concurrency, fits=fits,
                    estimated_max_model_len=longest, notes=(note,))


def largest_fitting(ok: Callable[[int], bool], upper: int) -> int:
    """The largest n in [1, upper] with ok(n) (ok is monotone), or 0 when even 1 fails."""
    if not ok(1):
        return 0
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def layer_stages(num_layers: int, pp: int, partition: tuple[int, ...] | None = None) -> list[range]:
    """Layers per pipeline stage, as vLLM's get_pp_indices splits them (SGLang's split is the same): L // pp
    each, the remainder going one by one to the stages before the last, starting from the second to last; or
    `partition`, the layers of each stage in order (vLLM's VLLM_PP_LAYER_PARTITION, checked as vLLM does)."""
    positive(pp, "pp", "pipeline parallel size")
    if pp > num_layers:
        raise EngineRuleError(f"pp {pp}: the model has only {num_layers} layers to split", param="pp")
    if partition is not None:
        if len(partition) != pp or any(n <= 0 for n in partition) or sum(partition) != num_layers:
            raise EngineRuleError(f"pp_layer_partition {','.join(map(str, partition))}: give {pp} positive layer "
                                  f"counts (one per pipeline stage) that add up to the model's {num_layers} layers",
                                  param="pp_layer_partition")
    sizes = list(partition) if partition is not None else [num_layers // pp] * pp
    for i in range(2, (num_layers % pp + 2) if partition is None else 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def serving_kv_dtype(model: ModelSpec, kv_dtype: str, tp: int, engine: str, accepted: str,
                     families: tuple[Family, ...] = (Family.FLOAT, Family.FP8)) -> KVDtype:
    """The checks every serving engine makes first: a valid tp, query heads that split evenly over it, and a
    KV dtype it can store (of `families`: a torch float type or fp8 by default; `accepted` names them)."""
    positive(tp, "tp", "tensor parallel size")
    if model.attention_heads and model.attention_heads % tp:
        raise EngineRuleError(f"tp: {model.name}: {engine} needs the {model.attention_heads} attention heads to "
                              f"split evenly over tensor parallel size {tp}", param="tp")
    dtype = resolve_kv_dtype(kv_dtype, model.dtype)
    if dtype.family not in families:
        raise EngineRuleError(f"kv_dtype {kv_dtype}: {engine}'s KV cache dtypes are {accepted}", param="kv_dtype")
    return dtype


def cheaper_if_wider(current: KVDtype, cheaper: str) -> str | None:
    """`cheaper` (an engine's 8-bit cache type) where the cache is stored in 2 or 4 bytes per value."""
    return cheaper if current.block_values == 1 and current.block_bytes > 1 else None


__all__ = ["Allocation", "CacheGroup", "Capacity", "CompressedGroup", "Engine", "EngineOptions", "LogCheck", "LogRow",
           "ReadsLogs", "Serving", "UsageGauge", "count_alike", "group_layers", "largest_fitting",
           "layer_stages", "serving_kv_dtype", "simple_capacity"]
