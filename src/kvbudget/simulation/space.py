"""`recommend`'s search space: the configurations a search may try (`Space`), each one (`Candidate`), and the list
of them (`candidates`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbudget import validate
from kvbudget.errors import KVBudgetError

if TYPE_CHECKING:
    from kvbudget.speculative import Speculative

MAX_CANDIDATES = 5_000  # candidates one search may list: about 10 minutes of simulation on two cores
MAX_SEARCH_GPUS = 64  # GPUs one candidate may take (--max-gpus): eight nodes of eight
TP_SIZES = (1, 2, 4, 8)  # tensor parallel sizes tried by default (within one node)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One configuration: `replicas` co-located replicas, or `prefill_replicas` + `decode_replicas` disaggregated,
    each on `tp` x `pp` GPUs of `gpu`, with the engine's settings (None: the engine's default for the GPU)."""

    gpu: str  # the GPU catalog's name
    tp: int = 1
    pp: int = 1
    replicas: int = 1  # co-located replicas (0 when disaggregated)
    prefill_replicas: int = 0
    decode_replicas: int = 0
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    kv_dtype: str = "auto"
    prefix_caching: bool = True
    offload_memory: int | None = None  # host memory for a KV offload tier, per replica over every rank
    speculative: Speculative | None = None  # speculative decoding (None: none)
    expert_parallel: bool = False  # the replicas are the data-parallel ranks of one group sharing the routed experts

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas > 0

    @property
    def replica_count(self) -> int:
        return self.prefill_replicas + self.decode_replicas if self.disaggregated else self.replicas

    @property
    def gpus(self) -> int:
        return self.replica_count * self.tp * self.pp

    @property
    def setting(self) -> tuple[Any, ...]:
        """What one replica's engine is planned from (the same for every replica count)."""
        return (self.gpu, self.tp, self.pp, self.max_num_seqs, self.max_num_batched_tokens,
                self.gpu_memory_utilization, self.kv_dtype, self.prefix_caching, self.offload_memory, self.speculative,
                self.replicas if self.expert_parallel else 1)

    def label(self) -> str:
        """In words: '2 x H100-80GB (TP 2), kv fp8, eagle3 k=2' or '1 prefill + 2 decode x L40S'."""
        shape = (f"{self.prefill_replicas} prefill + {self.decode_replicas} decode" if self.disaggregated
                 else f"{self.replicas}")
        par = ", ".join([*(f"{k} {v}" for k, v in (("TP", self.tp), ("PP", self.pp)) if v > 1),
                         *(["expert-parallel ranks"] if self.expert_parallel else [])])
        knobs = [f"{k} {v}" for k, v in (("max_num_seqs", self.max_num_seqs),
                                          ("max_num_batched_tokens", self.max_num_batched_tokens),
                                          ("gpu_memory_utilization", self.gpu_memory_utilization),
                                          ("offload", self.offload_memory and f"{self.offload_memory >> 30} GiB"))
                 if v is not None]
        if self.kv_dtype != "auto":
            knobs.insert(0, f"kv {self.kv_dtype}")
        if self.speculative is not None:
            knobs.insert(1 if self.kv_dtype != "auto" else 0, self.speculative.label())
        if not self.prefix_caching:
            knobs.append("no prefix caching")
        return f"{shape} x {self.gpu}" + (f" ({par})" if par else "") + (", " + ", ".join(knobs) if knobs else "")

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "speculative": self.speculative.to_dict() if self.speculative else None,
                "gpus": self.gpus, "disaggregated": self.disaggregated}


@dataclass(frozen=True, kw_only=True)
class Space:
    """The configurations a search may try: one value of each axis per candidate, at most `max_gpus` GPUs."""

    gpus: tuple[str, ...]
    max_gpus: int = 8
    tp: tuple[int, ...] = TP_SIZES
    pp: tuple[int, ...] = (1,)
    max_num_seqs: tuple[int | None, ...] = (None,)
    max_num_batched_tokens: tuple[int | None, ...] = (None,)
    gpu_memory_utilization: tuple[float | None, ...] = (None,)
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    prefix_caching: tuple[bool, ...] = (True,)
    offload_memory: tuple[int | None, ...] = (None,)
    speculative: tuple[Speculative | None, ...] = (None,)  # speculative decoding settings (None: none)
    disaggregated: bool = True  # also try a prefill and a decode pool (a KV link between them)
    expert_parallel: bool = True  # also try 2 or more replicas as one expert-parallel group (an MoE model's)

    def __post_init__(self) -> None:
        from kvbudget.gpus import find_gpu

        validate.count(self.max_gpus, "max_gpus", 1, MAX_SEARCH_GPUS)
        axes = (("gpus", self.gpus), ("tp", self.tp), ("pp", self.pp), ("max_num_seqs", self.max_num_seqs),
                ("max_num_batched_tokens", self.max_num_batched_tokens),
                ("gpu_memory_utilization", self.gpu_memory_utilization), ("kv_dtype", self.kv_dtypes),
                ("prefix_caching", self.prefix_caching), ("offload_memory", self.offload_memory),
                ("num_speculative_tokens", self.speculative))
        for name, values in axes:
            if not values:
                raise KVBudgetError(f"{name}: the search space is empty along it; give at least one value",
                                    param=name)
        object.__setattr__(self, "gpus", tuple(dict.fromkeys(find_gpu(g).name for g in self.gpus)))
        for name, values in axes[1:3]:
            for v in values:
                validate.count(v, name, 1, MAX_SEARCH_GPUS)
        for name, counts in axes[3:5]:
            for n in counts:
                if n is not None:
                    validate.positive(n, name, "a count")
        for u in self.gpu_memory_utilization:
            if u is not None:
                validate.fraction(u, "gpu_memory_utilization")
        for o in self.offload_memory:
            if o is not None:
                validate.size(o, "offload_memory")


def candidates(space: Space, expert_groups: bool = False) -> tuple[Candidate, ...]:
    """Every candidate of `space` (refused past MAX_CANDIDATES, before any is planned); `expert_groups`: the
    model has routed experts and the engine's groups are simulated (with Space.expert_parallel, tried too)."""
    out: list[Candidate] = []
    knobs = itertools.product(space.max_num_seqs, space.max_num_batched_tokens, space.gpu_memory_utilization,
                              space.kv_dtypes, space.prefix_caching, space.offload_memory, space.speculative)
    for (seqs, tokens, util, kv, cached, offload, spec), gpu, tp, pp in itertools.product(
            knobs, space.gpus, space.tp, space.pp):
        per = tp * pp
        shapes = [(n, 0, 0) for n in range(1, space.max_gpus // per + 1)]
        if space.expert_parallel and expert_groups:
            shapes += [(-n, 0, 0) for n in range(2, space.max_gpus // per + 1)]  # (-n: a group of n ranks)
        if space.disaggregated:
            shapes += [(0, p, d) for p in range(1, space.max_gpus // per) for d in range(1, space.max_gpus // per - p
                                                                                          + 1)]
        for n, p, d in shapes:
            out.append(Candidate(gpu=gpu, tp=tp, pp=pp, replicas=abs(n), prefill_replicas=p, decode_replicas=d,
                                 expert_parallel=n < 0, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                                 gpu_memory_utilization=util,
                                 kv_dtype=kv, prefix_caching=cached, offload_memory=offload, speculative=spec))
            if len(out) > MAX_CANDIDATES:
                raise KVBudgetError(f"max_gpus: the search space holds more than {MAX_CANDIDATES:,} candidates; "
                                    "lower it, or give fewer GPUs or fewer values per setting", param="max_gpus")
    if not out:
        raise KVBudgetError(f"max_gpus: {space.max_gpus} GPUs hold no candidate of tensor x pipeline parallel "
                            f"sizes {min(space.tp) * min(space.pp)} and up; raise it", param="max_gpus")
    return tuple(out)
