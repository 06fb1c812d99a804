"""The real engine: llama.cpp's `llama-perplexity` (built from the same source as the harness's llama-server),
run once for the baseline with an f32 cache (`--kl-divergence-base FILE` saves its log-probabilities and the
tokens) and once per cache format (`--kl-divergence -ctk K -ctv V`, flash attention on, as quantized V needs).

Facts from tools/perplexity/perplexity.cpp (llama.cpp in llama-cpp-python 0.3.36): the text is cut into chunks
of n_ctx tokens (whole chunks only, at least two); each chunk's first token becomes BOS when the vocabulary adds
one; only the second half of each chunk is scored (positions n_ctx/2 to n_ctx - 2 predict the next token); the
base file starts with "_logits_", then int32 n_ctx, n_vocab, n_chunk and the n_chunk × n_ctx token ids.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbudget.errors import KVBudgetError
from kvbudget.quality.formats import Variant

NAME = "llamacpp"  # the kvbudget engine this runner is the real binary of
ENGINE_CACHE = Path(os.environ.get("KVBUDGET_ENGINES", Path.home() / ".cache" / "kvbudget-engines"))
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def binary() -> Path:
    """llama-perplexity: $KVBUDGET_LLAMA_PERPLEXITY, on PATH, or where scripts/setup_engines.sh builds it."""
    named = os.environ.get("KVBUDGET_LLAMA_PERPLEXITY") or shutil.which("llama-perplexity")
    path = Path(named) if named else ENGINE_CACHE / "llama.cpp" / "bin" / "llama-perplexity"
    if not path.is_file():
        raise KVBudgetError("engine llamacpp needs llama-perplexity: build it (bash scripts/setup_engines.sh) or "
                            "put it on PATH (or set KVBUDGET_LLAMA_PERPLEXITY)", param="engine")
    return path


@dataclass(frozen=True, kw_only=True)
class EngineResult:
    variant: str
    kl_mean: float
    kl_p99: float
    kl_max: float
    top1: float
    perplexity: float
    base_perplexity: float

    def to_dict(self) -> dict[str, float | str]:
        return {"variant": self.variant, "kl_mean": self.kl_mean, "kl_p99": self.kl_p99, "kl_max": self.kl_max,
                "top1_agreement": self.top1, "perplexity": self.perplexity, "base_perplexity": self.base_perplexity}


def _run(args: list[str], what: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        tail = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-1:] or ["no output"]
        raise KVBudgetError(f"llama-perplexity failed ({what}): {tail[0].strip()}")
    return done.stdout + done.stderr


def _number(text: str, label: str) -> float:
    found = re.search(re.escape(label) + r"\s*:\s*([-\d.eE+]+)", text)
    if not found:
        raise KVBudgetError(f"llama-perplexity printed no '{label}' line; is it the llama.cpp the harness builds?")
    return float(found.group(1))


def read_base(path: Path) -> tuple[int, int, np.ndarray]:
    """(n_ctx, n_chunk, token ids [n_chunk, n_ctx]) from a --kl-divergence-base file."""
    with open(path, "rb") as fh:
        if fh.read(8) != b"_logits_":
            raise KVBudgetError(f"{path}: not a llama-perplexity log-probability file")
        n_ctx, _n_vocab, n_chunk = np.frombuffer(fh.read(12), dtype="<i4")
        tokens = np.frombuffer(fh.read(4 * int(n_ctx) * int(n_chunk)), dtype="<i4")
    return int(n_ctx), int(n_chunk), tokens.reshape(int(n_chunk), int(n_ctx))


class Perplexity:
    """One baseline run, then a run per format against it; `tokens` are the chunks llama.cpp scored."""

    def __init__(self, gguf: Path, text: str, context: int, chunks: int | None, threads: int | None = None):
        self.gguf = gguf
        self.exe = binary()
        self.context = context
        self.dir = Path(tempfile.mkdtemp(prefix="kvbudget-quality-"))
        self.base = self.dir / "base.kld"
        data = self.dir / "data.txt"
        data.write_text(text)
        self.common = ["-m", str(gguf), "-c", str(context), "-b", str(context), "-fa", "on",
                       "-t", str(threads or max(1, os.cpu_count() or 1))]
        extra = ["--chunks", str(chunks)] if chunks else []
        out = _run([str(self.exe), *self.common, "-f", str(data), "-ctk", "f32", "-ctv", "f32",
                    "--kl-divergence-base", str(self.base), *extra], "baseline")
        if not self.base.is_file() or self.base.stat().st_size < 20:  # (it writes its magic before it counts)
            need = re.search(r"you need at least (\d+) tokens", out)
            raise KVBudgetError(f"data: llama-perplexity needs at least {need.group(1) if need else 2 * context} "
                                f"tokens for a context of {context} (two whole chunks); give more text", param="data")
        _, _, self.tokens = read_base(self.base)

    def compare(self, variant: Variant) -> EngineResult:
        for half in (variant.k, variant.v):
            if half not in CACHE_TYPES:
                raise KVBudgetError(f"kv_dtype {half}: llama.cpp's caches are {', '.join(CACHE_TYPES)}",
                                    param="kv_dtype")
        out = _run([str(self.exe), *self.common, "--kl-divergence-base", str(self.base), "--kl-divergence",
                    "-ctk", variant.k, "-ctv", variant.v], variant.name)
        return EngineResult(variant=variant.name, kl_mean=_number(out, "Mean    KLD"),
                            kl_p99=_number(out, "99.0%   KLD"),
                            kl_max=_number(out, "Maximum KLD"), top1=_number(out, "Same top p") / 100,
                            perplexity=_number(out, "Mean PPL(Q)"), base_perplexity=_number(out, "Mean PPL(base)"))

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
