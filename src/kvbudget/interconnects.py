"""How long one tensor-parallel all-reduce takes over each kind of link (data/interconnects.json): a latency per
call plus the ring's traffic over the link's bus bandwidth, from public nccl-tests and aiconfigurator figures,
and which links a catalog card can be simulated over."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from kvbudget import validate
from kvbudget.choices import Interconnect
from kvbudget.errors import KVBudgetError, named, spelled
from kvbudget.gpus import GPU


@dataclass(frozen=True, kw_only=True)
class LinkFigures:
    """One kind of link as data/interconnects.json measures it."""

    kind: Interconnect
    latency: float  # seconds per all-reduce call (NCCL's)
    custom_latency: float | None  # vLLM's custom all-reduce kernel's, where vLLM runs it over this link
    bus_share: float | None  # of the card's link rate in one direction
    bus_bandwidth: float | None  # bytes per second (a network's, whatever the card)


@cache
def figures(kind: Interconnect) -> LinkFigures:
    data = json.loads((resources.files("kvbudget") / "data" / "interconnects.json").read_text(encoding="utf-8"))
    f = data["links"][kind.value]
    custom = f.get("custom_latency_us")
    return LinkFigures(kind=kind, latency=f["latency_us"] * 1e-6,
                       custom_latency=custom * 1e-6 if custom is not None else None, bus_share=f.get("bus_share"),
                       bus_bandwidth=f["bus_gbps"] * 1e9 if f.get("bus_gbps") else None)


def link_rate(card: GPU, kind: Interconnect) -> float | None:
    """The card's own rate for a link of this kind, one direction (bytes per second): NVLink's half its both-ways
    figure, PCIe's the card's slot; None for a network (its figure is its own) or where the catalog has none."""
    if kind is Interconnect.NVLINK:
        return card.nvlink_bytes_per_s / 2 if card.nvlink_bytes_per_s else None
    if kind in (Interconnect.PCIE, Interconnect.PCIE_NO_P2P):
        return card.host_link_bytes_per_s
    return None


def bus_bandwidth(card: GPU, kind: Interconnect) -> float | None:
    """The all-reduce's bus bandwidth (bytes per second) over `kind` from `card`, or None without figures."""
    f = figures(kind)
    if f.bus_bandwidth is not None:
        return f.bus_bandwidth
    rate = link_rate(card, kind)
    return f.bus_share * rate if rate and f.bus_share else None


def links_of(card: GPU) -> tuple[Interconnect, ...]:
    """The links `card` can be simulated over: those it can have in one node, PCIe without peer-to-peer (any card
    on a platform that blocks it) and the networks between nodes; each only where its figures can be had."""
    return tuple(k for k in Interconnect
                 if (k in card.links or k is Interconnect.PCIE_NO_P2P or k.across_nodes)
                 and bus_bandwidth(card, k) is not None)


# the links a card has or has not, in words
NAMES = {Interconnect.NVLINK: "NVLink", Interconnect.PCIE: "peer-to-peer access over PCIe"}


def check_link(card: GPU | None, kind: Interconnect, calibrated: bool = False) -> None:
    """A one-line error naming `interconnect` where `card` cannot be linked by `kind`: a link is a catalog card's,
    and a calibrated time model (`calibrated`) has its all-reduce in it already."""
    if card is None:
        raise KVBudgetError(f"interconnect: goes with {named('gpu')} (a catalog card: the link's rate is the "
                            "card's)", param="interconnect")
    if calibrated:
        raise KVBudgetError(f"interconnect: a calibrated time model "
                            f"({spelled('measured / time_model', '--calibrate FILE')}) has its all-reduce in it "
                            f"already; leave {named('interconnect')} out", param="interconnect")
    allowed = links_of(card)
    if kind not in allowed:
        has = (f"has no {NAMES[kind]}" if kind in NAMES and kind not in card.links
               else f"has no rate for {kind} in the catalog")
        raise KVBudgetError(f"interconnect {kind}: the {card.name} {has}; choose {', '.join(allowed)}",
                            param="interconnect")


@dataclass(frozen=True, kw_only=True)
class AllReduce:
    """One all-reduce's time over a link: `latency` + message bytes / `bandwidth`."""

    link: Interconnect
    latency: float  # seconds per call
    bandwidth: float  # bytes of the message per second: the bus bandwidth x tp / (2 (tp - 1)), as a ring moves it
    label: str  # for the basis text

    def seconds(self, message_bytes: float) -> float:
        return self.latency + message_bytes / self.bandwidth


def all_reduce(card: GPU, kind: Interconnect, tp: int) -> AllReduce | None:
    """An all-reduce of `tp` GPUs over `kind` from the figures of data/interconnects.json, or None where the card
    has no rate for it: NCCL's latency, or vLLM's custom kernel's where vLLM runs it (NVLink; PCIe with
    peer-to-peer at tp 2 only); each GPU of the ring sends and receives 2 (tp - 1) / tp of the message at the bus
    bandwidth. Figures measured on other hardware: an estimate, and labelled so."""
    bus = bus_bandwidth(card, kind)
    if bus is None or tp < 2:
        return None
    f = figures(kind)
    custom = f.custom_latency is not None and (kind is Interconnect.NVLINK or tp == 2)
    latency = f.custom_latency if custom and f.custom_latency is not None else f.latency
    label = (f"all-reduce over {kind}: {latency * 1e6:.1f} us + {bus / 1e9:.1f} GB/s bus bandwidth, public figures "
             "of other GPUs (estimate)")
    return AllReduce(link=kind, latency=latency, bandwidth=bus * tp / (2 * (tp - 1)), label=label)


@dataclass(frozen=True, kw_only=True)
class Gather:
    """The all-gather (and its reduce-scatter) of an expert-parallel group over a link: `latency` per call, and the
    bus bandwidth at which each GPU receives the other ranks' shares."""

    link: Interconnect
    latency: float  # seconds per call
    bandwidth: float  # bytes per second each GPU receives at
    label: str


def all_gather(card: GPU, kind: Interconnect, ranks: int) -> Gather | None:
    """An all-gather of `ranks` GPUs over `kind` from data/interconnects.json's figures, or None where the card has
    no rate for it: the link's all-reduce latency per call (over NVLink vLLM's custom kernel's, lower than NCCL's
    all-gather: an estimate, labelled so) and its bus bandwidth."""
    bus = bus_bandwidth(card, kind)
    if bus is None or ranks < 2:
        return None
    latency = figures(kind).latency
    return Gather(link=kind, latency=latency, bandwidth=bus,
                  label=f"all-gathers over {kind}: {latency * 1e6:.1f} us (its all-reduce's) + {bus / 1e9:.1f} GB/s "
                        "bus bandwidth, public figures of other GPUs (estimate)")


MAX_KV_LINK = 1e13  # bytes per second a KV link moves per GPU: 10 TB/s, past any NVLink or network (NVLink 5: 0.9)


@dataclass(frozen=True, kw_only=True)
class KVLink:
    """The link a prefilled request's KV crosses: a fixed latency per transfer and each GPU's own rate."""

    name: str
    latency: float  # seconds per transfer
    bandwidth: float  # bytes per second, each GPU reading its own shard over its own link

    def __post_init__(self) -> None:
        validate.number(self.latency, "kv_link", 0.0, validate.MAX_SECONDS, above=False)
        validate.number(self.bandwidth, "kv_link", 0.0, MAX_KV_LINK)

    def seconds(self, nbytes: int) -> float:
        return self.latency + nbytes / self.bandwidth

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "latency_s": self.latency, "bandwidth_bytes_per_s": self.bandwidth}


KV_LINKS = ("nvlink", "infiniband", "roce", "pcie", "tcp")
# each name's figures in data/interconnects.json: RoCE is the InfiniBand entry's (NCCL over RDMA), TCP Ethernet's
_KV_FIGURES = {"nvlink": Interconnect.NVLINK, "pcie": Interconnect.PCIE, "infiniband": Interconnect.INFINIBAND,
               "roce": Interconnect.INFINIBAND, "tcp": Interconnect.ETHERNET}


def kv_link(text: str, cards: Sequence[GPU | None] = ()) -> KVLink:
    """The link a disaggregated fleet moves KV over: a name (nvlink, infiniband, roce, pcie, tcp: the latency and
    rate of data/interconnects.json; NVLink and PCIe at the slowest of `cards`' own one-way rates), a rate
    (`25GB/s`, no latency), or both (`roce:50GB/s`: the name's latency at that rate)."""
    name, _, rate = text.strip().partition(":")
    name = name.lower()
    if name.endswith("/s") and not rate:
        name, rate = "", text.strip()
    if (name and name not in _KV_FIGURES) or not (name or rate):  # (":" names neither)
        raise KVBudgetError(f"kv_link {text}: name one of {', '.join(KV_LINKS)}, a rate such as 25GB/s, or "
                            "NAME:RATE", param="kv_link")
    latency, bandwidth = 0.0, None
    if name:
        kind = _KV_FIGURES[name]
        f = figures(kind)
        latency, bandwidth = f.latency, f.bus_bandwidth
        if bandwidth is None and not rate:
            rates = [link_rate(c, kind) if c is not None else None for c in cards] or [None]
            if any(r is None for r in rates):
                raise KVBudgetError(f"kv_link {text}: {name}'s rate is the card's own; give catalog GPUs that have "
                                    f"it, or a rate ({name}:25GB/s)", param="kv_link")
            bandwidth = min(r for r in rates if r is not None)
    if rate:
        try:
            value = float(rate[:-4]) * 1e9 if rate.endswith("GB/s") else None  # (bytes: Gb/s is refused)
        except ValueError:
            value = None
        if value is None or not 0 < value <= MAX_KV_LINK:
            raise KVBudgetError(f"kv_link {text}: {rate} is not a rate in GB/s (bytes) above 0 and at most "
                                f"{MAX_KV_LINK / 1e9:,.0f}GB/s (e.g. 25GB/s)", param="kv_link")
        bandwidth = value
    assert bandwidth is not None
    return KVLink(name=text.strip(), latency=latency, bandwidth=bandwidth)
