"""How much of the GPU each TGI release leaves to the KV cache after its warm-up, read from
server/text_generation_server/models/flash_causal_lm.py (`warmup`), utils/import_utils.py (`get_free_memory`),
models/globals.py (TGI_WIGGLE_ROOM) and utils/dist.py (CUDA_MEMORY_FRACTION, default 1.0) at every tag from
v0.9.0 to v3.3.7 of huggingface/text-generation-inference.

The warm-up runs the largest prefill (`--max-batch-prefill-tokens`), then measures what is free, with the
activations it reserved still held by torch's allocator; the blocks the warm-up batch held are added back. Of
that free memory (`mem_get_info` less (1 - CUDA_MEMORY_FRACTION) x total):

- v0.9.0-v1.4.0: all of it;
- v1.4.1-v2.3.1: 0.95 of it ("leave 5% for some wiggle room", TGI_WIGGLE_ROOM from v2.3.0);
- v2.4.0-v2.4.1: 0.90 of it;
- from v3.0.0 the wiggle room moved into the fraction of the total instead, `get_free_memory(device,
  MEMORY_FRACTION x TGI_WIGGLE_ROOM)`: 0.95 of the total (v3.0), 0.93 (v3.1-v3.2), 0.90 (v3.3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvbudget.errors import EngineRuleError


@dataclass(frozen=True)
class Era:
    """TGI releases from `first` on that size the cache alike: `wiggle` of the free memory, or (`of_total`) of the
    total, less what is in use."""

    first: tuple[int, int, int]
    wiggle: float
    of_total: bool


ERAS = (
    Era((0, 9, 0), 1.0, False),
    Era((1, 4, 1), 0.95, False),
    Era((2, 4, 0), 0.90, False),
    Era((3, 0, 0), 0.95, True),
    Era((3, 1, 0), 0.93, True),
    Era((3, 3, 0), 0.90, True),
)
NEWEST_READ = (3, 3, 7)  # the last tag read (TGI is in maintenance mode since December 2025)
MODELLED = "TGI 0.9.0 to 3.3.7 (tgi@3.3, tgi@2.4.1, ...)"


def parse_release(text: str) -> tuple[int, int, int]:
    """`3.3`, `v2.4.1` -> (major, minor, patch); an unread release is an error that names the ones read."""
    m = re.fullmatch(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?\s*", text)
    version = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None
    if version is None or not ERAS[0].first <= version <= NEWEST_READ:
        raise EngineRuleError(f"engine_version {text}: kvbudget reads {MODELLED}", param="engine_version")
    return version


def era(version: tuple[int, ...] | None) -> Era:
    """The rule of `version` (the newest read when None)."""
    version = version or NEWEST_READ
    return [e for e in ERAS if e.first <= tuple(version)][-1]


def describe(e: Era) -> str:
    start = ".".join(map(str, e.first))
    return (f"{e.wiggle:g} of the total less what the warm-up left in use (TGI {start} on)" if e.of_total else
            f"{e.wiggle:g} of what is free after the warm-up (TGI {start} on)")
