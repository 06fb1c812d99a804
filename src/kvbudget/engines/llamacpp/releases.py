"""What changed llama.cpp's KV numbers from build to build, each change named by its pull request and read from
the llama.cpp copies vendored in the llama-cpp-python sdists 0.2.90, 0.3.2, 0.3.8, 0.3.9, 0.3.12, 0.3.14,
0.3.16, 0.3.20 and 0.3.36 on PyPI.

- cells are padded to 256 with flash attention and to 32 without (#7257, `llama_kv_cache_get_padding`, until
  0.3.16) -- flash attention counts as on when `-fa auto` (`cparams.flash_attn = type != DISABLED` before the
  memory is made); #16812 (2025-10-28) removed the padding, #17046 (2025-11-06) brought back 256 whatever -fa;
- sliding-window layers shared the one cache of n_ctx cells until #13194 (2025-05-20, `llama_kv_cache_unified_
  iswa`) gave them their own of pad(n_swa x n_seq + n_batch) cells; #13833 (b5554) made that n_swa x n_seq +
  n_ubatch; with per-sequence streams (#14363, b5913) it is n_swa + n_ubatch per stream unless --kv-unified;
- before #14363 every sequence shared one stream of pad(n_ctx) cells; from it, each of `-np` streams holds
  pad(ceil(n_ctx / np)) cells (0.3.16), and from #16812 pad(pad(n_ctx) / np) (0.3.20 `n_ctx_seq`);
- `-fa` was off unless given until flash_attn_type's `auto` became the default (by b6327: mybigday/llama.node#102
  syncs to b6327 on 2025-08-31 to pick it up).

The build numbers of #13833 and #14363 are exact (llama.cpp issues #14071: b5552 without, b5554 = 3600cc28;
#14847: b5912 without, b5913 with). The others are known only to a window: #13194 after b5400 (estimated
from its merge date) and by b5554; -fa auto after b6250 (estimated) and by b6327; #16812 after b6850
(estimated) and by b6969 (issue #17058, a regression of b6969 that #17046 fixed); #17046 after b6969 and by
b7000 (estimated). A build inside a window is modelled as the newer behaviour and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvbudget.errors import EngineRuleError


@dataclass(frozen=True)
class Change:
    """One pull request that changed the cache: the last build known without it and the first known with it."""

    ref: str  # the pull request, or where the change is first seen
    merged: str
    last_without: int
    first_with: int
    what: str

    @property
    def exact(self) -> bool:
        return self.first_with - self.last_without <= 2

    def in_window(self, build: int) -> bool:
        return self.last_without < build < self.first_with


SWA_CACHE = Change("#13194", "2025-05-20", 5400, 5554, "sliding-window layers get their own cache")
SWA_UBATCH = Change("#13833", "2025-05-31", 5552, 5554, "the SWA cache holds n_swa + n_ubatch cells, not + n_batch")
STREAMS = Change("#14363", "2025-07-16", 5912, 5913, "one stream of cells per sequence unless --kv-unified")
FA_AUTO = Change("flash_attn_type", "2025-08-30", 6250, 6327, "-fa defaults to auto (counted as on for padding)")
NO_PAD = Change("#16812", "2025-10-28", 6850, 6969, "the cache size is no longer padded")
PAD_256 = Change("#17046", "2025-11-06", 6969, 7000, "the cache size is padded to 256 cells, flash attention or not")
CHANGES = (SWA_CACHE, SWA_UBATCH, STREAMS, FA_AUTO, NO_PAD, PAD_256)
NEWEST_BUILD = 10_000_000  # "the newest build": every change above included
N_BATCH = 2048  # llama-server's default -b
N_UBATCH = 512  # llama-server's default -ub (the physical batch)
CACHE_TYPES = ("float32", "float16", "bfloat16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
# the cache type names llama.cpp logs and takes (-ctk / -ctv)
LOG_TYPES = {"f16": "float16", "f32": "float32", "bf16": "bfloat16", "q8_0": "q8_0", "q4_0": "q4_0",
             "q4_1": "q4_1", "q5_0": "q5_0", "q5_1": "q5_1", "iq4_nl": "iq4_nl"}
CACHE_RAM_MIB = 8192  # llama-server's default host-RAM prompt cache (--cache-ram)


@dataclass(frozen=True)
class Release:
    """The behaviours of one llama.cpp build (its bNNNN number) that change KV figures."""

    build: int = NEWEST_BUILD

    def has(self, change: Change) -> bool:
        return self.build >= change.first_with or change.in_window(self.build)

    @property
    def own_swa_cache(self) -> bool:
        return self.has(SWA_CACHE)

    @property
    def streams(self) -> bool:
        return self.has(STREAMS)

    def swa_batch(self, n_ubatch: int, n_batch: int = N_BATCH) -> int:
        """The batch added to the window in the SWA cache's size."""
        return n_ubatch if self.has(SWA_UBATCH) else n_batch

    @property
    def flash_attn_default(self) -> bool:
        return self.has(FA_AUTO)

    def padding(self, flash_attn: bool) -> int:
        if self.has(PAD_256):
            return 256
        if self.has(NO_PAD):
            return 1
        return 256 if flash_attn else 32

    @property
    def pads_total_first(self) -> bool:
        """From #16812 the context computes n_ctx_seq = pad(n_ctx) / np; before, the memory took ceil(n_ctx / np)."""
        return self.has(NO_PAD)

    def notes(self) -> tuple[str, ...]:
        if self.build == NEWEST_BUILD:
            return ()
        out = []
        for change in CHANGES:
            if change.in_window(self.build):
                out.append(f"llama.cpp b{self.build} may predate {change.ref} ({change.what}; merged "
                           f"{change.merged}, known in b{change.first_with}): modelled with it")
        return tuple(out)


NEWEST = Release()


def parse_build(text: str) -> int:
    """The build number of `b6182`, `6182` or a log's `version: 6182 (abc123)`."""
    m = re.fullmatch(r"\s*b?(\d+)\s*", text)
    if not m:
        raise EngineRuleError(f"engine_version {text!r}: give a llama.cpp build such as b6182 (llama-server "
                              "--version prints it)", param="engine_version")
    build = int(m.group(1))
    if build < 3000:
        raise EngineRuleError(f"engine_version {text}: kvbudget models llama.cpp from b3000 (mid-2024) on",
                              param="engine_version")
    return build
