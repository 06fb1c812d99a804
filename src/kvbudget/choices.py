"""Closed sets of values as types: each a `Choice`, an Enum of strings that prints, formats and serialises (JSON)
as its value, so that output reads as it did when these were plain strings and a member still equals its text.

The sets the engines' options, the simulator's allocator and its admission policies take live here; the KV dtype
families are in `dtypes`, the memory stack's terms in `budget`. Text is turned into a member once, where it comes
in (a request's reader, `setup_for`, `parse_allocator`), with a one-line error naming the parameter.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from kvbudget.errors import KVBudgetError
from kvbudget.validate import shown

if TYPE_CHECKING:
    from typing_extensions import Self


class Choice(str, Enum):
    """A member is its value as text: str(), format() and json.dumps() give the value (Python 3.10 to 3.13)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(str(m.value) for m in cls)

    @classmethod
    def parse(cls, text: str, param: str) -> Self:
        """The member `text` names; a one-line error naming `param` otherwise."""
        try:
            return cls(text)
        except ValueError:
            raise KVBudgetError(f"{param}: {shown(str(text))} is not one of {', '.join(cls.values())}",
                                param=param) from None


class Device(Choice):
    """Where an engine runs (vLLM's CPU backend differs in block size and state dtype)."""

    CUDA = "cuda"
    CPU = "cpu"


class EntryPoint(Choice):
    """How vLLM is started: `vllm serve` (the OpenAI server) or the Python LLM class; their batch defaults differ."""

    SERVER = "server"
    LLM = "llm"


class AllocatorKind(Choice):
    """The simulator's KV allocator: the engine's own (paged), or a contiguous reservation per request (the
    PagedAttention paper's baselines)."""

    PAGED = "paged"
    CONTIGUOUS = "contiguous"


class Reservation(Choice):
    """How much a contiguous allocator reserves per request (the paper's Orca variants, §6.1): max_model_len
    slots, the output rounded up to a power of two, or exactly prompt + output."""

    MAX = "max"
    POW2 = "pow2"
    ORACLE = "oracle"


class Allocator(str):
    """The simulator's allocator: its `kind` and, when contiguous, its `reservation` policy. It is its own text as
    the command line names it (paged, contiguous-max, contiguous-pow2, contiguous-oracle), so that it prints, is
    written to JSON and compares as that text did; `parse_allocator` makes one from text."""

    kind: AllocatorKind
    reservation: Reservation | None

    def __new__(cls, kind: AllocatorKind = AllocatorKind.PAGED, reservation: Reservation | None = None) -> Self:
        if (kind is AllocatorKind.CONTIGUOUS) != (reservation is not None):
            raise ValueError(f"allocator {kind}: a reservation policy goes with a contiguous allocator only")
        self = super().__new__(cls, str(kind) if reservation is None else f"{kind}-{reservation}")
        self.kind, self.reservation = kind, reservation
        return self

    def __reduce__(self) -> tuple[type[Self], tuple[AllocatorKind, Reservation | None]]:
        return type(self), (self.kind, self.reservation)

    @property
    def paged(self) -> bool:
        return self.kind is AllocatorKind.PAGED

    @property
    def short(self) -> str:
        """The policy alone where contiguous (a sweep's column), else the kind."""
        return str(self.reservation or self.kind)


PAGED = Allocator()
ALLOCATORS = (PAGED, *(Allocator(AllocatorKind.CONTIGUOUS, r) for r in Reservation))


def parse_allocator(text: str) -> Allocator:
    """`paged` or `contiguous-POLICY` as an Allocator (one already is); a one-line error naming the allocator
    otherwise."""
    if isinstance(text, Allocator):
        return text
    found = next((a for a in ALLOCATORS if a == text), None)
    if found is None:
        raise KVBudgetError(f"allocator {text}: choose {', '.join(ALLOCATORS)}", param="allocator")
    return found


class Admission(Choice):
    """The admission policy in front of a simulated engine (simulation/guarded.py): none, the llm-d router's
    (the Gateway API Inference Extension's Endpoint Picker) saturation shedding, its flow control (a bounded queue
    at the gateway: simulation/front.py), a static concurrency limit (`concurrency:N`), or kvbudget's guard."""

    NONE = "none"
    GIE = "gie"
    LLMD = "llm-d"
    CONCURRENCY = "concurrency"
    KVBUDGET = "kvbudget"

    @property
    def spelled(self) -> str:
        """How it is written (the concurrency limit takes its N)."""
        return f"{self}:N" if self is Admission.CONCURRENCY else str(self)


class Interconnect(Choice):
    """How the GPUs of tensor parallelism are linked (each all-reduce crosses it): NVLink (AMD: Infinity Fabric,
    the card's own GPU-to-GPU links), PCIe with peer-to-peer access, PCIe without it (NCCL copies through host
    memory, as on GeForce cards or where the platform blocks P2P), or the network between nodes (Ray across
    servers): Ethernet (NCCL over TCP sockets) or InfiniBand / RoCE."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    PCIE_NO_P2P = "pcie-no-p2p"
    ETHERNET = "ethernet"
    INFINIBAND = "infiniband"

    @property
    def across_nodes(self) -> bool:
        return self in (Interconnect.ETHERNET, Interconnect.INFINIBAND)
