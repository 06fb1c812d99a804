"""Start real vLLM on a GPU for a few catalog models at two settings and record the memory split it logs, as
cases of tests/data/memory/vllm.json. For a machine with a GPU and vLLM installed (it downloads nothing: the
weights are vLLM's dummy weights of the real architecture, `load_format="dummy"`, and no tokenizer is loaded).

    python scripts/gpu_memory_split.py --out DIR [--models llama-3.1-8b qwen3-8b] [--timeout 240]

Writes DIR/cases.json (the corpus's format, role "check", the GPU's name as torch reports it and its total) and
each run's log beside it. Compare them with `python benchmarks/bench_memory.py --corpus DIR/cases.json` after
naming the GPU as the catalog does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SETTINGS = {"defaults": {}, "small-batch": {"max_num_seqs": 256, "max_num_batched_tokens": 2048}}
RUN = """
import json, sys
from vllm import LLM
kwargs = json.loads(sys.argv[1])
LLM(**kwargs)
print("KVBUDGET-STARTED", flush=True)
"""
LINES = {
    "total_gib": r"Free memory on device \(([\d.]+)/([\d.]+) GiB\)",
    "weights_gib": r"Model loading took ([\d.]+) GiB",
    "kv_gib": r"Available KV cache memory: (-?[\d.]+) GiB",
    "activation_gib": r"torch peak memory increase: ([\d.]+) ?GiB",
    "non_torch_gib": r"non-torch forward increase memory: (-?[\d.]+) ?GiB",
    "cuda_graph_gib": r"(?:Graph capturing finished in [\d.]+ secs?, took|CUDA graph memory[^:]*:) (-?[\d.]+) GiB",
}


def parse(log: str) -> dict[str, float]:
    """The memory figures a vLLM start-up log printed (the last of each; GiB)."""
    out = {}
    for key, pattern in LINES.items():
        found = re.findall(pattern, log)
        if found:
            last = found[-1]
            out[key] = float(last[1] if isinstance(last, tuple) else last)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=["llama-3.1-8b", "qwen3-8b"])
    parser.add_argument("--max-model-len", type=int, default=16384)
    parser.add_argument("--utilization", type=float, default=0.9)
    parser.add_argument("--timeout", type=int, default=240, help="seconds per start-up")
    args = parser.parse_args()
    try:
        import torch
        import vllm
    except ImportError as exc:
        sys.exit(f"gpu_memory_split: {exc.name} is not installed here; this script needs vLLM on a GPU machine")
    if not torch.cuda.is_available():
        sys.exit("gpu_memory_split: no GPU visible to torch")
    import kvbudget

    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0)
    cases = []
    for name in args.models:
        config = kvbudget.load_model(name).config
        for label, extra in SETTINGS.items():
            with tempfile.TemporaryDirectory() as folder:
                (Path(folder) / "config.json").write_text(json.dumps(config))
                kwargs = {"model": folder, "load_format": "dummy", "skip_tokenizer_init": True,
                          "max_model_len": args.max_model_len, "gpu_memory_utilization": args.utilization, **extra}
                env = dict(os.environ, VLLM_LOGGING_LEVEL="DEBUG", HF_HUB_OFFLINE="1")
                try:
                    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(kwargs)], env=env,
                                          capture_output=True, text=True, timeout=args.timeout)
                    log, status = done.stdout + done.stderr, done.returncode
                except subprocess.TimeoutExpired as exc:
                    log, status = f"{exc.stdout or ''}{exc.stderr or ''}\n(timed out)", -1
            (args.out / f"{name}-{label}.log").write_text(log)
            logged = parse(log)
            print(f"{name} {label}: exit {status}, {logged}", flush=True)
            cases.append({"id": f"ours-{name}-{label}", "role": "check", "engine": "vllm",
                          "release": ".".join(vllm.__version__.split(".")[:2]), "gpu": gpu, "tp": 1,
                          "max_model_len": args.max_model_len, "utilization": args.utilization, "model": name,
                          "settings": extra, "logged": logged, "started": "KVBUDGET-STARTED" in log,
                          "source": f"our run on {gpu} (scripts/gpu_memory_split.py)", "licence": "ours"})
            (args.out / "cases.json").write_text(json.dumps({"cases": cases}, indent=1))


if __name__ == "__main__":
    main()
