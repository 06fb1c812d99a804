"""How long `kvbudget quality` takes: SmolLM2-135M-Instruct, 5 formats over 4,096 tokens of the GPL's text (8
windows of 512), the transformers path on this machine's CPU; and where the time goes (loading, the baseline
passes, the formats' passes, the quantizers themselves).

    python benchmarks/bench_quality.py
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

from kvbudget.errors import KVBudgetError
from kvbudget.quality import formats, load, measure
from kvbudget.quality.formats import Variant

TEXT = Path("/usr/share/common-licenses/GPL-3")
VARIANTS = [Variant.parse(v) for v in ("f16", "q8_0", "q4_0", "fp8", "k=q4_0,v=q8_0")]


def main() -> None:
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    start = time.perf_counter()
    loaded = load.load_model(load.BUNDLED)
    print(f"load (GGUF dequantized by transformers): {time.perf_counter() - start:.1f} s")
    ids = loaded.tokenizer(TEXT.read_text(), add_special_tokens=False)["input_ids"]
    chunks = list(measure.windows(ids, 512, 8))
    start = time.perf_counter()
    for chunk in chunks:
        measure.log_probs(loaded, chunk, None)
    base = time.perf_counter() - start
    print(f"baseline passes, {len(chunks)} x 512 tokens: {base:.1f} s")
    k = torch.randn(1, 3, 512, 64)
    for name in ("q8_0", "q4_0", "fp8"):
        fn = formats.store(name, 64)
        start = time.perf_counter()
        for _ in range(30 * 2):  # 30 layers, K and V, one window
            fn(k)
        print(f"  {name} quantizer, one window's K and V in all 30 layers: {time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    measure.compare(loaded, chunks, VARIANTS)
    total = time.perf_counter() - start
    print(f"compare, {len(VARIANTS)} formats x {len(chunks) * 512:,} tokens (baseline once per window): {total:.1f} s")
    for name in ("iq4_nl",):
        fn = formats.store(name, 64)
        start = time.perf_counter()
        for _ in range(30 * 2):
            fn(k)
        print(f"  {name} quantizer, one window's K and V in all 30 layers: {time.perf_counter() - start:.2f} s")
    try:
        backend = Variant.parse("quanto_int4").backend
        assert backend is not None
        backend.cache(loaded.spec)
    except KVBudgetError as exc:
        print(f"transformers' QuantizedCache: skipped ({exc})")
        return
    for name, use in (("untouched", None), ("quanto_int4", backend)):
        start = time.perf_counter()
        measure.decode_log_probs(loaded, chunks[0], use, 256)
        print(f"one window decoded token by token after 256 in one pass, {name} cache: "
              f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
