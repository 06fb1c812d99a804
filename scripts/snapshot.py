"""Every command's answer on a fixed set of cases, in one JSON file: run it before and after a refactoring and
compare the two files byte for byte (`cmp before.json after.json`).

The cases: estimate and plan of every catalog model on every engine (--json), compare, simulate on each engine
that has a scheduler model (a synthetic workload and a bundled trace slice), check-log on every log of the test
corpus, the guard's config, error messages and exit statuses of bad input, and the web API's answers to the
same questions. Usage: python scripts/snapshot.py OUT.json
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

from kvbudget.catalog import entries
from kvbudget.cli import main
from kvbudget.engines import ENGINES

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "data" / "logs"


def run(argv: list[str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code
    return {"status": status, "out": out.getvalue(), "err": err.getvalue()}


def cases() -> list[list[str]]:
    models = [e.name for e in entries()]
    engines = [e for e in ENGINES if e != "hf-static"]
    argvs: list[list[str]] = []
    for model in models:
        for engine in engines:
            argvs.append(["estimate", model, "--engine", engine, "--context", "1k,32k", "--batch", "1,4", "--json"])
            argvs.append(["plan", model, "--engine", engine, "--gpu", "H100-80GB", "--tp", "8", "--json"])
        argvs.append(["estimate", model])
    for gpu in ("L4", "A100-40GB", "H200"):
        argvs.append(["plan", "llama-3.1-8b", "--gpu", gpu, "--max-model-len", "32k", "--json"])
        argvs.append(["plan", "llama-3.1-8b", "--gpu", gpu, "--max-model-len", "32k"])
        argvs.append(["plan", "llama-3.1-70b", "--gpu", gpu, "--guard-config", "-", "--force"])
    argvs.append(["compare", "llama-3.1-8b", "mistral-7b", "qwen3-8b", "gemma-2-9b", "--gpu", "L4", "--json"])
    argvs.append(["compare", "llama-3.1-8b", "mistral-7b", "qwen3-8b", "gemma-2-9b", "--gpu", "L4"])
    sims = [
        ["llama-3.1-8b", "--gpu", "L4", "--max-model-len", "16k", "--rate", "4", "--requests", "300"],
        ["gemma-2-9b", "--gpu", "H100-80GB", "--max-model-len", "8k", "--rate", "4", "--requests", "200"],
        ["qwen3-next-80b-a3b", "--gpu", "H200", "--tp", "2", "--max-model-len", "8k", "--rate", "4", "--requests",
         "200"],
        ["llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8k", "--rate", "4", "--requests", "200", "--allocator",
         "contiguous-max"],
        ["llama-3.1-8b", "--engine", "sglang", "--gpu", "L4", "--max-model-len", "8k", "--rate", "4", "--requests",
         "200"],
        ["llama-3.1-8b", "--engine", "llamacpp", "--gpu", "L4", "--max-model-len", "8k", "--max-num-seqs", "4",
         "--rate", "2", "--requests", "100"],
        ["llama-3.1-8b", "--engine", "tgi", "--gpu", "L4", "--rate", "2", "--requests", "10"],
        ["qwen3-8b", "--engine", "llamacpp", "--gpu", "L4", "--max-model-len", "8k", "--max-num-seqs", "4",
         "--kv-unified", "--rate", "2", "--requests", "100"],
        ["llama-3.1-8b", "--gpu", "L4", "--max-model-len", "16k", "--trace", "azure-conv-2023", "--slice",
         "0:300"],
        ["llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "128k", "--trace", "mooncake-conv",
         "--slice", "0:100"],
        ["gemma-2-9b", "--gpu", "H100-80GB", "--max-model-len", "8k", "--rate", "4", "--requests", "200",
         "--no-prefix-caching"],
        ["llama-3.1-8b", "--engine", "hf", "--gpu", "L4", "--rate", "2", "--requests", "10"],
    ]
    for sim in sims:
        argvs.append(["simulate", *sim, "--json"])
        argvs.append(["simulate", *sim])
    corpus = json.loads((LOGS / "corpus.json").read_text())["logs"]
    for entry in corpus:
        model = str(LOGS / entry["model"]) if entry["model"].endswith(".json") else entry["model"]
        given = [f"--{k.replace('_', '-')}={v}" for k, v in entry.get("given", {}).items()]
        argvs.append(["check-log", str(LOGS / entry["file"]), "--model", model, "--json", *given])
        argvs.append(["check-log", str(LOGS / entry["file"]), "--model", model, *given])
    for bad in (["estimate", "nope"], ["estimate", "llama-3.1-8b", "--tp", "3"], ["plan", "llama-3.1-8b"],
                ["plan", "llama-3.1-8b", "--gpu", "H900"], ["simulate", "llama-3.1-8b", "--engine", "hf"],
                ["simulate", "llama-3.1-8b", "--engine", "sglang", "--gpu", "L4", "--num-blocks", "10"],
                ["simulate", "llama-3.1-8b", "--engine", "llamacpp", "--gpu", "L4", "--num-blocks", "10"],
                ["simulate", "gemma-2-9b", "--gpu", "L4", "--allocator", "contiguous-max"],
                ["simulate", "llama-3.1-8b", "--kv-unified", "--gpu", "L4"],
                ["estimate", "llama-3.1-8b", "--kv-dtype", "q4_0"], ["alerts", "--engine", "foo"],
                ["estimate", "llama-3.1-8b", "--prompt-file", "a", "--lengths-from", "b"],
                ["estimate", "llama-3.1-8b", "--prompt-file", "a", "--context", "4k"],
                ["estimate", "llama-3.1-8b", "--max-new-tokens", "5"], ["estimate", "llama-3.1-8b", "--batch", "0"],
                ["estimate", "llama-3.1-8b", "--tp", "1,2"], ["estimate", "llama-3.1-8b", "--kv-memory", "x"],
                ["plan", "llama-3.1-8b", "--gpu", "L4", "--utilization", "abc"],
                ["plan", "llama-3.1-8b", "--gpu", "L4", "--gpus", "0"], ["compare", "llama-3.1-8b"],
                ["compare", "llama-3.1-8b", "mistral-7b", "--engine", "vllm@0.8", "--gpu", "L4"],
                ["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--slo", "ttft_p99=1s"],
                ["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--find-max-rate", "--sweep", "tp=1,2"],
                ["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--engine", "vllm@0.8"],
                ["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--slice", "x"],
                ["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--cache-ram", "x"],
                ["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--cv", "0"],
                ["simulate", "llama-3.1-8b", "--gpu", "L4", "--trace", "azure-conv-2023", "--request-log", "x"],
                ["simulate", "llama-3.1-8b", "--gpu", "L4"],
                ["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--guard-config", "/nonexistent.yaml"],
                ["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--engine", "tgi", "--prometheus-series",
                 "/tmp/x", "--force"],
                ["guard", "--upstream", "http://127.0.0.1:1", "--kv-memory", "lots"]):
        argvs.append(bad)
    return argvs


def web() -> dict[str, object]:
    from starlette.testclient import TestClient

    from kvbudget.web.app import create_app

    client = TestClient(create_app(Path("/tmp/kvbudget-snapshot-uploads")))
    queries = ["/api/choices", "/api/estimate?model=llama-3.1-8b&tp=2", "/api/estimate?model=gemma-2-9b&engine=sglang",
               "/api/plan?model=llama-3.1-8b&gpu=L4&max_model_len=32k", "/api/plan?model=llama-3.1-70b&gpu=L4",
               "/api/compare?model=llama-3.1-8b&model=mistral-7b&gpu=L4", "/api/guard.yaml?model=llama-3.1-8b&gpu=L4",
               "/api/simulate?model=llama-3.1-8b&gpu=L4&max_model_len=16k&trace=azure-conv-2023&slice=0:200",
               "/api/simulate?model=llama-3.1-8b&gpu=L4&max_model_len=16k&rate=3&requests=200&guard=1",
               "/api/plan?model=llama-3.1-8b&gpu=H900", "/api/plan?model=llama-3.1-8b&gpu_memory=lots",
               "/api/estimate?model=llama-3.1-8b&tp=3", "/api/estimate?model=../x",
               "/api/estimate?model=llama-3.1-8b&x=1",
               "/api/simulate?model=llama-3.1-8b&engine=hf&gpu=L4", "/api/plan?model=llama-3.1-8b&engine=foo&gpu=L4",
               "/api/estimate?model=llama-3.1-8b&batch=0", "/api/estimate?model=llama-3.1-8b&tp=1&tp=2",
               "/api/estimate?model=llama-3.1-8b&no_prefix_caching=maybe",
               "/api/estimate?model=llama-3.1-8b&device=tpu",
               "/api/estimate?model=llama-3.1-8b&model=mistral-7b", "/api/estimate", "/api/compare?model=llama-3.1-8b",
               "/api/plan?model=llama-3.1-8b&gpu=L4&utilization=abc",
               "/api/simulate?model=llama-3.1-8b&gpu=L4&rate=1&slice=x",
               "/api/simulate?model=llama-3.1-8b&gpu=L4&rate=1&requests=999999",
               "/api/simulate?model=llama-3.1-8b&gpu=L4&trace=nope", "/api/plan?model=llama-3.1-8b&gpu=L4&json=1",
               "/api/estimate?model=llama-3.1-8b&engine=vllm@0.8&no_prefix_caching=1&context=4k"]
    return {q: (lambda r: [r.status_code, r.text])(client.get(q)) for q in queries}


if __name__ == "__main__":
    answers = {" ".join(a): run(a) for a in cases()}
    answers["web"] = web()
    Path(sys.argv[1]).write_text(json.dumps(answers, indent=1, sort_keys=True))
    print(f"{len(answers) - 1} commands and {len(answers['web'])} web answers written to {sys.argv[1]}")
