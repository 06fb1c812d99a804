"""What the simulator is asked (`SimulationAsk`) and what it runs (`Setup`), and the capability an engine offers
to be simulated (`Simulates`, whose `Simulator` reads the one and writes the other). Engine-independent: an engine
fills in a Setup with its own rules and builds its scheduler from it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kvbudget import validate
from kvbudget.choices import PAGED, Allocator
from kvbudget.engines.base import Allocation, Capacity, Engine, EngineOptions
from kvbudget.engines.scheduling.seq import Queues, SchedulerConfig, Seq, Step
from kvbudget.engines.scheduling.timing import MeasuredStep, TimeModel
from kvbudget.engines.tiers import HostTier
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.speculative import Speculative

if TYPE_CHECKING:
    from kvbudget.choices import Device, EntryPoint, Interconnect
    from kvbudget.interconnects import KVLink


MAX_DISK_READ = 1e12  # bytes per second a disk tier reads at: 1,000 GB/s, past any drive or array on one host


@dataclass(frozen=True, kw_only=True)
class SimulationAsk:
    """`setup_for`'s arguments: the memory and scheduler settings a simulation is asked for (None: the engine's
    default, or the planner's)."""

    model: ModelSpec
    engine: Engine
    gpu: str | None = None
    gpu_memory: int | None = None
    kv_memory: int | None = None
    num_blocks: int | None = None
    tp: int = 1
    pp: int = 1
    kv_dtype: str = "auto"
    max_model_len: int | None = None
    block_size: int | None = None
    device: Device = EngineOptions.device
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    time_model: TimeModel | None = None
    allocator: Allocator = PAGED  # the engine's own, or a contiguous reservation per request
    measured: Sequence[MeasuredStep] | None = None
    kv_unified: bool = False
    cache_ram: int | None = None
    weights: int | None = None
    utilization: float | None = None  # the engine's memory fraction, as plan takes it
    enforce_eager: bool = False
    extensible_kv_cache: bool = True  # vLLM >= 0.34's cache sized after warm-up (False: the former sizing)
    entry_point: EntryPoint = EngineOptions.entry_point  # vLLM: vllm serve, or the Python LLM class
    lora: tuple[int, int] | None = None  # vLLM --enable-lora: (max_loras, max_lora_rank)
    offload_memory: int | None = None  # host memory for the engine's KV offload tier, over every rank
    offload_backend: str | None = None
    offload_disk: int | None = None  # disk for the backend's disk tier behind host memory, over every rank
    disk_read: float | None = None  # bytes per second the disk tier reads at
    engine_version: tuple[int, ...] | None = None  # the release whose budget and defaults to take (None: newest)
    interconnect: Interconnect | None = None  # what tensor parallelism's GPUs are linked by (None: the card's own)
    speculative: Speculative | None = None  # speculative decoding as asked (the engine says what it simulates)
    expert_parallel: int = 1  # data-parallel ranks sharing an MoE's routed experts (1: none; ExpertGroup)

    def __post_init__(self) -> None:
        """Every number in its range, whoever built the ask (the CLI, the web page, `setup_for`)."""
        for value, param, least in ((self.gpu_memory, "gpu_memory", 1), (self.kv_memory, "kv_memory", 1),
                                    (self.weights, "weights", 0), (self.offload_memory, "offload_memory", 1),
                                    (self.offload_disk, "offload_disk", 1)):
            if value is not None:
                validate.size(value, param, least)
        lora = self.lora or (None, None)
        for value, param, what in ((self.tp, "tp", "tensor parallel size"), (self.pp, "pp", "pipeline parallel size"),
                                   (self.num_blocks, "num_blocks", "KV blocks"),
                                   (self.max_model_len, "max_model_len", "tokens"),
                                   (self.block_size, "block_size", "tokens per block"),
                                   (self.max_num_seqs, "max_num_seqs", "sequences"),
                                   (self.max_num_batched_tokens, "max_num_batched_tokens", "tokens"),
                                   (lora[0], "max_loras", "adapters"), (lora[1], "max_lora_rank", "rank"),
                                   (self.expert_parallel, "expert_parallel", "data-parallel ranks")):
            if value is not None:
                validate.positive(value, param, what)
        validate.count(self.long_prefill_token_threshold, "long_prefill_token_threshold")
        if self.cache_ram is not None:  # MiB
            validate.count(self.cache_ram, "cache_ram", 0, validate.MAX_BYTES >> 20)
        if self.utilization is not None:
            validate.fraction(self.utilization, "utilization")
        if self.disk_read is not None:
            validate.number(self.disk_read, "disk_read", 0.0, MAX_DISK_READ)
        if self.interconnect is not None:  # a link the catalog card has, for the default time model
            from kvbudget.gpus import find_gpu
            from kvbudget.interconnects import check_link

            check_link(find_gpu(self.gpu) if self.gpu else None, self.interconnect,
                       calibrated=self.measured is not None or self.time_model is not None)

    def engine_options(self, batched: bool = True) -> EngineOptions:
        """The options to plan with (`batched`: the engine takes max_num_batched_tokens)."""
        return EngineOptions(block_size=self.block_size,
                             max_num_batched_tokens=self.max_num_batched_tokens if batched else None,
                             prefix_caching=self.prefix_caching, device=self.device,
                             max_num_seqs=self.max_num_seqs if self.engine.profiles_batch else None,
                             enforce_eager=self.enforce_eager, entry_point=self.entry_point,
                             enable_lora=self.lora is not None, max_loras=self.lora[0] if self.lora else 1,
                             max_lora_rank=self.lora[1] if self.lora else 16, engine_version=self.engine_version,
                             speculative=self.speculative, extensible_kv_cache=self.extensible_kv_cache)

    @property
    def budget_given(self) -> bool:
        """Whether the KV budget is stated (a GPU, its memory or the budget itself)."""
        return self.gpu is not None or self.gpu_memory is not None or self.kv_memory is not None


@dataclass(frozen=True, kw_only=True)
class Planned:
    """What the simulator settles before the engine fills in its setup: the memory the planner found for the ask's
    settings, and the parts every engine shares."""

    capacity: Capacity  # the planner's: the KV budget in the engine's blocks, slots or tokens
    allocation: Allocation  # what one sequence keeps, per cache group
    kv_memory_bytes: int  # the planner's KV budget per GPU
    gpu_memory_bytes: int  # the GPU's memory the plan ran on
    gpu_name: str  # the plan's name for that GPU
    serving_options: EngineOptions  # the plan's options, the engine's defaults for the GPU filled in
    options: EngineOptions  # what the plan was asked with (the engine's `Simulator.options`)
    max_model_len: int
    time_model: TimeModel
    gpu: str | None  # the GPU's name where one was given (a catalog card or its memory)
    kv_memory: int | None  # the KV budget where one was given
    drafting: Drafting | None = None  # speculative decoding's drafter and its time (None: none asked)


@dataclass(frozen=True, kw_only=True)
class Drafting:
    """Speculative decoding as simulated: what was asked, and the drafter's time after each step: K steps of its
    own time model (a draft model or head: the first over the step's tokens, which fills its KV, the others one
    token a sequence), or a CPU cost per sequence (n-gram and suffix lookup); `basis` says what either rests on."""

    spec: Speculative
    time_model: TimeModel | None
    cpu_per_seq: float = 0.0
    basis: str

    def seconds(self, step: Step) -> float:
        """The drafter's seconds after `step` (every scheduled request drafts, or fills the drafter's KV)."""
        r = len(step.scheduled)
        tm = self.time_model
        if tm is None:
            return self.cpu_per_seq * r
        first = tm.step_seconds(step.tokens, step.context, step.pairs or step.context, r)
        rest = self.spec.num_tokens - 1
        return first + rest * tm.step_seconds(r, step.context, None, r) if rest else first

    def to_dict(self) -> dict[str, Any]:
        s = self.spec
        return {**s.to_dict(), "acceptance": list(s.rates()), "acceptance_source": s.acceptance_source,
                "acceptance_draw": "replayed" if s.replayed is not None else s.draw.value, "acceptance_seed": s.seed,
                "drafter_time": self.basis,
                "drafter_time_model": self.time_model.to_dict() if self.time_model else None,
                "drafter_cpu_per_seq_s": self.cpu_per_seq}


HIDDEN = {"json": False}  # a field to_dict() leaves out


@dataclass(frozen=True, kw_only=True)
class ExpertGroup:
    """A replica that is one of `ranks` data-parallel ranks of an expert-parallel group (vLLM --data-parallel-size
    --enable-expert-parallel): every rank its own scheduler and KV cache, all stepping together
    (simulation/expertgroup.py). What the group adds to a rank's step beyond its time model: the MoE layers'
    all-gather and reduce-scatter, a fixed part per step and a part per token of the other ranks."""

    ranks: int
    gather_latency: float  # seconds per step
    gather_per_token: float  # seconds per token the other ranks run
    # a step of at most this many tokens on every rank runs as a CUDA graph, padded to the group's largest step
    # (0: never, as under --enforce-eager)
    graph_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Role(Enum):
    """What a replica does in a fleet: all of a request (co-located), or one side of disaggregated serving."""

    BOTH = "both"
    PREFILL = "prefill"  # computes the prompt and the first token, holds its KV until the decode side has read it
    DECODE = "decode"  # takes the prompt's KV over a link, then generates the output


@dataclass(frozen=True, kw_only=True)
class Disagg:
    """A replica's side of disaggregated prefill and decode, and the link between the sides."""

    role: Role
    link: KVLink

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role.value, "link": self.link.to_dict()}


class CacheGroupRecord(Protocol):
    """One of an engine's KV cache groups as its scheduler keeps them."""

    def to_dict(self) -> dict[str, object]: ...


@dataclass(frozen=True, kw_only=True)
class Setup:
    """What was simulated: the engine's memory and scheduler settings, and where each came from."""

    engine: str
    model: str
    num_blocks: int
    block_size: int
    kv_memory_bytes: int | None
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    prefix_caching: bool
    long_prefill_token_threshold: int
    gpu: str | None
    time_model: TimeModel
    bytes_per_token: int = 0  # KV bytes per token on the most loaded GPU
    gpus: int = 1  # the GPUs of one replica (tensor x pipeline parallel)
    allocator: str = "paged"  # the engine's name for its allocator (vLLM: or contiguous-max / -pow2 / -oracle)
    allocation: Allocation | None = field(default=None, repr=False, compare=False, metadata=HIDDEN)  # the guard's
    groups: tuple[CacheGroupRecord, ...] = ()  # the engine's KV cache groups as its scheduler keeps them
    scheduling: str = "the scheduling itself is exact"  # how far the scheduler is verified
    prompt_cache_bytes: int = 0  # llama.cpp's host-RAM prompt cache (--cache-ram)
    host_tier: HostTier | None = field(default=None, metadata=HIDDEN)  # a KV offload tier behind the prefix cache
    host_block_seconds: float = 0.0  # ... and the time to load one of its units over the GPU's host link
    disk_tier: HostTier | None = field(default=None, metadata=HIDDEN)  # a disk tier behind the host tier
    disk_unit_seconds: float = 0.0  # ... and the time to read one of its units and load it
    disagg: Disagg | None = field(default=None, metadata=HIDDEN)  # one side of disaggregated prefill and decode
    drafting: Drafting | None = None  # speculative decoding (None: none)
    expert_group: ExpertGroup | None = None  # a rank of an expert-parallel group (None: a replica alone)
    # the engine's scheduler model, which builds the scheduler for this setup
    simulator: Simulator = field(repr=False, compare=False, metadata=HIDDEN)

    @property
    def token_slots(self) -> int:
        """Tokens the KV cache holds, as the engine counts its memory."""
        return self.simulator.token_slots(self)

    def describe(self, short: bool = False) -> str:
        """The engine's memory and scheduler settings in words (`short`: the memory alone)."""
        return self.simulator.describe(self, short)

    @property
    def free_label(self) -> str:
        """What the engine's unused token slots are, in words."""
        return self.simulator.free_label(self)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("json", True)}
        out["time_model"] = self.time_model.to_dict()
        out["groups"] = [g.to_dict() for g in self.groups]
        out["host_tier"] = self.host_tier.to_dict() if self.host_tier else None
        out["disk_tier"] = self.disk_tier.to_dict() if self.disk_tier else None
        if self.disagg is not None:
            out["disagg"] = self.disagg.to_dict()
        out["drafting"] = self.drafting.to_dict() if self.drafting else None
        out["expert_group"] = self.expert_group.to_dict() if self.expert_group else None
        return out


def config_of(setup: Setup) -> SchedulerConfig:
    """The settings every scheduler reads, from a setup."""
    return SchedulerConfig(num_blocks=setup.num_blocks, block_size=setup.block_size, max_num_seqs=setup.max_num_seqs,
                           max_num_batched_tokens=setup.max_num_batched_tokens,
                           max_model_len=setup.max_model_len, prefix_caching=setup.prefix_caching,
                           long_prefill_token_threshold=setup.long_prefill_token_threshold)


def refuse_slot_settings(ask: SimulationAsk) -> None:
    """Raise for the settings of llama.cpp's slots, for an engine without them."""
    if ask.kv_unified:
        raise KVBudgetError("kv_unified: a llama.cpp setting (one cell pool for all slots)", param="kv_unified")
    if ask.cache_ram is not None:
        raise KVBudgetError(CACHE_RAM, param="cache_ram")


CACHE_RAM = "cache_ram: llama.cpp's host-RAM prompt cache, in MiB (0 turns it off); other engines have none"


class SimulatorDefaults:
    """What most engines' scheduler models answer alike (an engine's Simulator may start from it): settings of
    llama.cpp's slots refused, the budget needed, the token slots and free memory counted as the engine's own, and
    the scheduler's settings described as vLLM names them."""

    offloads = False
    speculates = False
    expert_groups = False

    def check_release(self, ask: SimulationAsk) -> None:
        """Raise for an engine release the scheduler model does not take (here: any but the newest)."""
        if ask.engine_version is not None:
            name = ask.engine.name
            raise KVBudgetError(f"engine {name}@VERSION: simulate follows the newest release of {name}'s scheduler "
                                f"only; give {name} without @VERSION (estimate and plan take releases)", param="engine")

    def options(self, ask: SimulationAsk) -> EngineOptions:
        self.check_release(ask)
        refuse_slot_settings(ask)
        return ask.engine_options()

    def sized_without_budget(self, ask: SimulationAsk) -> bool:
        return False

    def disaggregation(self, setup: Setup) -> str | None:
        return f"simulate follows disaggregated prefill and decode on vLLM (its NIXL connector), not {setup.engine}"

    def kv_read_bytes(self, setup: Setup, prompt_tokens: int) -> int:
        raise KVBudgetError(f"engine: {self.disaggregation(setup)}", param="engine")
    def token_slots(self, setup: Setup) -> int:
        return setup.num_blocks

    def memory(self, setup: Setup) -> str:
        """The memory alone, in words."""
        return f"{self.token_slots(setup):,} token slots"

    def describe(self, setup: Setup, short: bool = False) -> str:
        s = setup
        if short:
            return self.memory(s)
        return self.memory(s) + (f"; max_num_seqs {s.max_num_seqs}, max_num_batched_tokens "
                                 f"{s.max_num_batched_tokens}, prefix caching {'on' if s.prefix_caching else 'off'}")

    def free_label(self, setup: Setup) -> str:
        return "free"


class Simulator(Protocol):
    """An engine's scheduler model for `simulate`: its settings, its scheduler and how it counts its memory."""

    offloads: bool  # simulates the engine's KV offload tier (SimulationAsk.offload_memory)
    speculates: bool  # simulates speculative decoding (SimulationAsk.speculative, Setup.drafting)
    expert_groups: bool  # simulates data-parallel ranks sharing routed experts (SimulationAsk.expert_parallel)

    def options(self, ask: SimulationAsk) -> EngineOptions:
        """The options to plan the ask with; raises first for settings that mean nothing to this engine (and for
        an engine_version its scheduler model does not take)."""

    def sized_without_budget(self, ask: SimulationAsk) -> bool:
        """Whether the ask sizes the cache without a GPU or KV budget (llama.cpp: its slots)."""
    def setup(self, ask: SimulationAsk, planned: Planned) -> Setup:
        """The engine's memory and scheduler settings for the ask; raises where the engine would not start."""

    def scheduler(self, setup: Setup) -> Queues:
        """A fresh scheduler for `setup` (one side of disaggregated serving where `setup.disagg` says)."""

    def disaggregation(self, setup: Setup) -> str | None:
        """Why `setup` cannot be one side of disaggregated prefill and decode, in words (None: it can)."""

    def kv_read_bytes(self, setup: Setup, prompt_tokens: int) -> int:
        """Bytes one GPU of a decode replica reads for a prompt it has nothing of (the engine's transfer unit)."""

    def token_slots(self, setup: Setup) -> int:
        """Tokens the KV cache of `setup` holds."""

    def describe(self, setup: Setup, short: bool = False) -> str:
        """The memory and scheduler settings of `setup` in words (`short`: the memory alone)."""

    def free_label(self, setup: Setup) -> str:
        """What the unused token slots of `setup` are, in words."""


@runtime_checkable
class TimesHost(Protocol):
    """A scheduler model that knows its engine's CPU work around the GPU's (a Simulator may also be one)."""

    def with_host(self, time_model: TimeModel, options: EngineOptions, tp: int, pp: int) -> TimeModel:
        """The default time model of the GPU's kernels (never a calibrated or given one) with the engine's CPU
        work around them: per step, per request, its frontend (the release in `options`, tp x pp GPUs)."""


@runtime_checkable
class LimitsQueue(Protocol):
    """A scheduler model whose engine's API server refuses requests past its own queue limits (vLLM's
    --max-num-queued-reqs and --max-num-queued-tokens)."""

    def queue_refusal(self, max_reqs: int | None, max_tokens: int | None, unfinished: Iterable[Seq],
                      n: int) -> str | None:
        """The limit a request of `n` samples is refused by, given the sequences not finished; None: admitted."""


def with_host(simulator: Simulator, time_model: TimeModel, options: EngineOptions, tp: int, pp: int) -> TimeModel:
    """`time_model` with the simulator's engine's CPU work around the GPU's, where it models that work."""
    return simulator.with_host(time_model, options, tp, pp) if isinstance(simulator, TimesHost) else time_model


@runtime_checkable
class Simulates(Protocol):
    """An engine with a scheduler model for `simulate` (the capability; an engine without it is refused)."""

    name: str

    def simulator(self) -> Simulator:
        """The engine's scheduler model."""
