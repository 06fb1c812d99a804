"""Record the compute and output buffers real llama-server start-ups print, for tests/data/llamacpp/: every GGUF
under the engines folder (the tiny models tests/engines builds, and the bundled SmolLM2 GGUF given with --gguf),
with flash attention on and off, n_ubatch 512 and 2048, n_ctx 2048 and 8192, one slot; and for the GGUFs given
with --gguf, several slots too (own streams and --kv-unified, an n_ctx below n_ubatch, an n_ubatch no slot count
divides). Prints JSON runs.

    python scripts/llamacpp_buffers.py [--engines ~/.cache/kvbudget-engines] [--gguf NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
from pathlib import Path

# (n_ubatch, n_ctx, slots, --kv-unified): several slots, each with its own stream or sharing one; an n_ctx below
# n_ubatch; a batch no slot count divides
SLOTS = ((512, 6144, 3, False), (512, 6144, 3, True), (512, 1000, 4, False), (512, 300, 2, True),
         (1000, 4000, 5, False), (2048, 700, 1, False))
BUFFER = re.compile(r"(\w+)\s+(output|compute) buffer size =\s+([\d.]+) MiB")


def buffers(server: Path, gguf: Path, *args: object) -> dict[str, float]:
    """The buffer sizes one start-up prints (its last reservation of each), the server stopped once it listens."""
    proc = subprocess.Popen([str(server), "-m", str(gguf), "--port", "0", "-t", "1", "--no-warmup", "-v",
                             "--cache-ram", "0", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    found: dict[str, float] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := BUFFER.search(line):
            found[m.group(2)] = float(m.group(3))
        if "listening" in line or "exiting" in line:
            break
    proc.kill()
    proc.wait()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=Path, default=Path.home() / ".cache" / "kvbudget-engines")
    parser.add_argument("--gguf", action="append", default=[], help="NAME=PATH of another GGUF to run")
    args = parser.parse_args()
    server = args.engines / "llama.cpp" / "bin" / "llama-server"
    models = {p.parent.name: p for p in sorted((args.engines / "models").glob("*/model.gguf"))}
    models.update(dict(item.split("=", 1) for item in args.gguf))
    given = {item.split("=", 1)[0] for item in args.gguf}
    runs = []
    for name, path in models.items():
        settings = [(fa, ub, ctx, 1, False)
                    for fa, ub, ctx in itertools.product(("on", "off"), (512, 2048), (2048, 8192))]
        if name in given:
            settings += [(fa, *slots) for fa in ("on", "off") for slots in SLOTS]
        for fa, ub, ctx, n_parallel, unified in settings:
            got = buffers(server, Path(path), "-c", ctx, "-np", n_parallel, "-ub", ub, "-b", max(ub, 2048), "-fa", fa,
                          *(["--kv-unified"] if unified else []))
            runs.append({"model": name, "flash_attn": fa, "n_ubatch": ub, "n_ctx": ctx, "n_parallel": n_parallel,
                         "unified": unified, "compute_mib": got.get("compute"), "output_mib": got.get("output")})
    print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
