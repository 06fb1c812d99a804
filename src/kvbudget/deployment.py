"""A deployment to write out: the settings of each pool of replicas, as `recommend` chose them (or a user gives them),
in the terms every engine's launcher and every manifest writer reads. Bytes inside; no engine named here."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbudget.engines.scheduling.setup import Role
from kvbudget.errors import KVBudgetError
from kvbudget.speculative import Speculative


@dataclass(frozen=True, kw_only=True)
class PoolPlan:
    """One pool: `replicas` copies of one engine server, each on `tp` x `pp` GPUs of one kind."""

    role: Role = Role.BOTH
    replicas: int = 1
    gpu: str  # the GPU catalog's name (data/gpus.json)
    tp: int = 1
    pp: int = 1
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    gpu_memory_utilization: float  # the engine's memory fraction (vLLM's --gpu-memory-utilization)
    kv_dtype: str = "auto"
    block_size: int | None = None  # None: the engine's default
    prefix_caching: bool = True
    offload_bytes: int | None = None  # a host-memory KV tier per replica (None: none)
    # the engine's own admission (vLLM --max-num-queued-reqs / --max-num-queued-tokens), from the guard's levels
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    speculative: Speculative | None = None  # speculative decoding (None: none); the launchers write it per engine
    # data-parallel ranks in one server sharing an MoE's routed experts (vLLM --data-parallel-size N
    # --enable-expert-parallel), each on tp x pp GPUs; 1: none
    expert_ranks: int = 1
    # vLLM >= 0.34: the cache sized from the memory free after warm-up (False: --no-enable-extensible-kv-cache)
    extensible_kv_cache: bool = True

    def __post_init__(self) -> None:
        for value, name in ((self.replicas, "replicas"), (self.tp, "tp"), (self.pp, "pp"),
                            (self.expert_ranks, "expert_ranks"),
                            (self.max_num_seqs, "max_num_seqs"), (self.max_num_batched_tokens,
                                                                  "max_num_batched_tokens"),
                            (self.max_model_len, "max_model_len")):
            if value < 1:
                raise KVBudgetError(f"{name} {value}: give a whole number of at least 1", param=name)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise KVBudgetError(f"gpu_memory_utilization {self.gpu_memory_utilization}: give a fraction in (0, 1]",
                                param="gpu_memory_utilization")

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one replica (one engine server) takes."""
        return self.tp * self.pp * self.expert_ranks

    @property
    def gpus(self) -> int:
        """GPUs the pool takes in all."""
        return self.replicas * self.gpus_per_replica


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """What to run: a model (its Hub id, what the engine loads) on one engine release, in one pool of co-located
    replicas or a prefill pool and a decode pool joined by a KV link, behind a router."""

    model: str  # the Hub id the engine loads (e.g. meta-llama/Llama-3.1-8B-Instruct)
    engine: str  # the engine's name as kvbudget knows it (kvbudget.engines.names())
    release: str | None = None  # the engine release the settings were planned for (None: the newest kvbudget knows)
    pools: tuple[PoolPlan, ...]
    router: str = "round-robin"  # a router as `simulate --router` names it
    kv_link: str | None = None  # disaggregated only: the link as `simulate --kv-link` takes it
    served_name: str | None = None  # the name clients ask for (None: the model id)
    port: int = 8000
    notes: tuple[str, ...] = field(default=())  # what the writer should say beside the files (assumptions)

    def __post_init__(self) -> None:
        roles = sorted(p.role.value for p in self.pools)
        if roles not in (["both"], ["decode", "prefill"]):
            raise KVBudgetError(f"pools {roles}: give one co-located pool, or one prefill and one decode pool",
                                param="pools")
        if (roles == ["decode", "prefill"]) != (self.kv_link is not None):
            raise KVBudgetError("kv_link: give a link exactly when prefill and decode are disaggregated",
                                param="kv_link")

    @property
    def disaggregated(self) -> bool:
        return self.kv_link is not None

    def pool(self, role: Role) -> PoolPlan:
        """The pool of that role (ValueError where there is none)."""
        for p in self.pools:
            if p.role is role:
                return p
        raise ValueError(f"no {role.value} pool")

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)
