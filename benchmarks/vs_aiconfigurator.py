"""kvbudget beside NVIDIA aiconfigurator on the same (model, GPU, ISL/OSL, TTFT/TPOT) cases: what aiconfigurator
chose and predicted (benchmarks/data/aiconfigurator/cases.json), kvbudget's simulation of that same choice, the KV
budget each gives that choice, kvbudget's own choice (`recommend`, at the rate aiconfigurator's choice predicts) and
aiconfigurator's estimate of it. Prints figures; asserts nothing.

    python benchmarks/vs_aiconfigurator.py                    # reads cases.json: under a minute, no aiconfigurator
    python benchmarks/vs_aiconfigurator.py --table            # both tools' choices only, from cases.json
    python benchmarks/vs_aiconfigurator.py --search           # kvbudget's six searches again (~15 min), recorded
    python3 -m venv /tmp/aic && /tmp/aic/bin/pip install aiconfigurator
    python benchmarks/vs_aiconfigurator.py --refresh /tmp/aic # asks aiconfigurator again, searches, rewrites

aiconfigurator runs in its own environment, as its users install it (it is not a dependency of kvbudget):
`aiconfigurator cli default` for each case (backend vllm, 8 GPUs, aggregated and disaggregated), its best row of
each mode (`best_config_topn.csv`), the vLLM flags it writes for it (`top1/run_0.sh`) and, for each engine it
would start, its own KV budget (`aiconfigurator_core.sdk.memory.estimate_kv_cache`, memory fraction 0.9 of the
total, vLLM's default, as the flags leave it).

How kvbudget simulates aiconfigurator's choice (its operating point is a steady state of fixed lengths):
- aggregated: one replica (aiconfigurator's per-GPU figures are one replica's) on the same GPU at its TP/PP and
  with the flags it writes (max_num_seqs, max_num_batched_tokens, max_model_len), `bs` clients in a closed loop
  (`simulate(max_concurrency=bs)`, as `vllm bench serve --max-concurrency`) sending ISL-token prompts for exactly
  OSL tokens, 6 x bs requests; the first and last bs are warm-up and drain, the steady state is the rest: mean
  TTFT, mean TPOT, and output tokens/s/GPU = bs x OSL / mean E2E / GPUs (Little's law, aiconfigurator's own
  arithmetic: its seq/s is bs / request latency).
- disaggregated: its prefill and decode workers as two pools (`simulate_fleet`, router round-robin, KV link
  `nvlink`: its 8 GPUs are one node), requests at its predicted request rate, evenly spaced (its steady state),
  6 x concurrency of them; steady-state means as above, output tokens/s/GPU as served in the steady window (the
  requests finishing between the arrivals of the first and last sixth, times OSL): aiconfigurator's figure where
  the simulated pools keep up with its rate, less where they do not (and a TTFT that grows with the queue).
Both sides model the same vLLM release: the one aiconfigurator's database measured (its rows' `version`), as
kvbudget's `vllm@VERSION`. kvbudget's step times here are its roofline-and-fitted-kernels estimate for the GPU
(no calibration on these cases: nothing is fitted on aiconfigurator's figures, which are a model's output, not
measurements).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kvbudget
from kvbudget.engines.scheduling.setup import Role
from kvbudget.errors import KVBudgetError
from kvbudget.simulation import Request, simulate
from kvbudget.simulation.fleet import Pool, simulate_fleet
from kvbudget.simulation.run import setup_for

CASES = Path(__file__).resolve().parent / "data" / "aiconfigurator" / "cases.json"
GPUS = {"h100_sxm": "H100-80GB", "h200_sxm": "H200"}  # aiconfigurator's system -> kvbudget's GPU
MODELS = {"meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b", "meta-llama/Meta-Llama-3.1-70B": "llama-3.1-70b",
          "Qwen/Qwen3-32B": "qwen3-32b"}  # aiconfigurator's model id -> kvbudget's catalog
TOTAL_GPUS = 8
UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization: aiconfigurator's flags leave it
SEARCH_SPAN = 3  # kvbudget's search replays this many times aiconfigurator's concurrency in requests (~2 minutes)
# (case id, aiconfigurator model, system, ISL, OSL, TTFT ms, TPOT ms)
ASKED = [
    ("llama8b-h100-4000-500", "meta-llama/Meta-Llama-3.1-8B", "h100_sxm", 4000, 500, 1000, 20),
    ("llama8b-h200-1000-1000", "meta-llama/Meta-Llama-3.1-8B", "h200_sxm", 1000, 1000, 300, 10),
    ("llama70b-h100-4000-500", "meta-llama/Meta-Llama-3.1-70B", "h100_sxm", 4000, 500, 2000, 50),
    ("llama70b-h200-1000-1000", "meta-llama/Meta-Llama-3.1-70B", "h200_sxm", 1000, 1000, 1000, 30),
    ("qwen32b-h100-1000-1000", "Qwen/Qwen3-32B", "h100_sxm", 1000, 1000, 1000, 30),
    ("qwen32b-h200-4000-500", "Qwen/Qwen3-32B", "h200_sxm", 4000, 500, 1500, 40),
]
KV_SCRIPT = """
import json, os, shutil, sys, tempfile, aiconfigurator_core
from aiconfigurator_core.sdk.memory import estimate_kv_cache
ask = json.loads(sys.argv[1])
folder = tempfile.mkdtemp()
name = ask["model"].replace("/", "--") + "_config.json"
shutil.copy(os.path.join(os.path.dirname(aiconfigurator_core.__file__), "model_configs", name),
            os.path.join(folder, "config.json"))
got = estimate_kv_cache(folder, ask["system"], "vllm", ask["version"], max_num_tokens=ask["mnbt"],
                        max_batch_size=ask["seqs"], memory_fraction_kind="of_total",
                        memory_fraction_value=ask["utilization"], tp_size=ask["tp"])
print(json.dumps({"tokens": got["total_kv_size_tokens"], "bytes_per_gpu": got["total_kv_size_bytes"]}))
"""


# ---- asking aiconfigurator (--refresh) ----

def _flags(script: Path) -> list[dict[str, Any]]:
    """The vLLM flags of each engine a generated run_0.sh starts (prefill first where disaggregated)."""
    engines = []
    for line in script.read_text().splitlines():
        if "--tensor-parallel-size" not in line:
            continue
        words = shlex.split(line.split("2>&1")[0])
        flag = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
        engines.append({"tp": int(flag["--tensor-parallel-size"]), "pp": int(flag["--pipeline-parallel-size"]),
                        "max_num_seqs": int(flag["--max-num-seqs"]),
                        "max_num_batched_tokens": int(flag["--max-num-batched-tokens"]),
                        "max_model_len": int(flag["--max-model-len"]) if "--max-model-len" in flag else None,
                        "mode": flag.get("--disaggregation-mode", "agg")})
    return engines


def _kv(aic: Path, model: str, system: str, version: str, engine: dict[str, Any]) -> dict[str, Any]:
    ask = {"model": model, "system": system, "version": version, "mnbt": engine["max_num_batched_tokens"],
           "seqs": engine["max_num_seqs"], "tp": engine["tp"], "utilization": UTILIZATION}
    done = subprocess.run([str(aic / "bin" / "python"), "-W", "ignore", "-c", KV_SCRIPT, json.dumps(ask)],
                          capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _number(text: str) -> float | int:
    return int(float(text)) if float(text).is_integer() else float(text)


def ask_aiconfigurator(aic: Path) -> dict[str, Any]:
    """Every case of ASKED through `aiconfigurator cli default`: its choice and prediction per mode."""
    exe = aic / "bin" / "aiconfigurator"
    version = subprocess.run([str(exe), "version"], capture_output=True, text=True).stdout.strip()
    cases = []
    for cid, model, system, isl, osl, ttft, tpot in ASKED:
        with tempfile.TemporaryDirectory() as tmp:
            command = [str(exe), "cli", "default", "--model-path", model, "--system", system, "--backend", "vllm",
                       "--total-gpus", str(TOTAL_GPUS), "--isl", str(isl), "--osl", str(osl), "--ttft", str(ttft),
                       "--tpot", str(tpot), "--save-dir", tmp]
            subprocess.run(command, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONWARNINGS": "ignore"})
            out = next(Path(tmp).rglob("agg")).parent
            modes: dict[str, Any] = {}
            for mode in ("agg", "disagg"):
                rows = list(csv.DictReader((out / mode / "best_config_topn.csv").open()))
                if not rows:
                    modes[mode] = None
                    continue
                engines = _flags(out / mode / "top1" / "run_0.sh")
                db = str(rows[0].get("version") or rows[0].get("(p)version"))
                for e in engines:
                    e["aiconfigurator_kv"] = _kv(aic, model, system, db, e)
                modes[mode] = {"row": {k: _number(v) if re.fullmatch(r"-?\d+(\.\d+)?", v) else v
                                       for k, v in rows[0].items()}, "engines": engines}
        shown = ["aiconfigurator", *command[1:-2]]
        cases.append({"id": cid, "model": model, "system": system, "isl": isl, "osl": osl, "ttft_ms": ttft,
                      "tpot_ms": tpot, "total_gpus": TOTAL_GPUS, "command": shlex.join(shown), **modes})
    return {"aiconfigurator_version": version, "cases": cases}


ESTIMATE_SCRIPT = """
import json, logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from aiconfigurator.cli.api import cli_estimate
got = cli_estimate(**json.loads(sys.argv[1]))
print(json.dumps({"ttft_ms": float(got.ttft), "tpot_ms": float(got.tpot),
                  "tokens_s_gpu": float(got.raw["tokens/s/gpu"]), "request_rate": float(got.raw["request_rate"])}))
"""


def estimate_ask(case: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """What aiconfigurator's `cli estimate` is asked about kvbudget's choice: its shape (aggregated: one replica of
    TP x PP; disaggregated: the prefill and decode workers), each engine's batch the choice's steady concurrency
    by Little's law (the requests in flight = rate x time each spends there: a co-located replica's share of the
    rate x E2E; a decode replica's x (E2E - TTFT); prefill one at a time, as aiconfigurator's own prefill rows)."""
    c, v = own["candidate"], own["values_s"]
    rate = own["asked"]["rate"]
    ask: dict[str, Any] = {"model_path": case["model"], "system_name": case["system"], "backend_name": "vllm",
                           "backend_version": case["vllm"], "isl": case["isl"], "osl": case["osl"],
                           "tp_size": c["tp"], "pp_size": c["pp"]}
    if not c["disaggregated"]:
        return {**ask, "mode": "agg", "batch_size": max(1, round(rate / c["replicas"] * v["e2e_p50"]))}
    decode = max(1, round(rate / c["decode_replicas"] * (v["e2e_p50"] - v["ttft_mean"])))
    return {**ask, "mode": "disagg", "batch_size": decode, "prefill_tp_size": c["tp"], "prefill_pp_size": c["pp"],
            "prefill_num_workers": c["prefill_replicas"], "prefill_batch_size": 1, "decode_tp_size": c["tp"],
            "decode_pp_size": c["pp"], "decode_num_workers": c["decode_replicas"], "decode_batch_size": decode}


def aiconfigurator_estimate(aic: Path, ask: dict[str, Any]) -> dict[str, Any]:
    """The reverse: aiconfigurator's prediction for a configuration it is given (`cli estimate`'s function,
    `aiconfigurator.cli.api.cli_estimate`, asked as `estimate_ask` says): TTFT and TPOT (ms), output tokens/s per
    GPU and the request rate it predicts (one replica's where aggregated, the whole where disaggregated)."""
    done = subprocess.run([str(aic / "bin" / "python"), "-W", "ignore", "-c", ESTIMATE_SCRIPT, json.dumps(ask)],
                          capture_output=True, text=True, check=True)
    return {"asked": ask, **json.loads(done.stdout.strip().splitlines()[-1])}


# ---- kvbudget's side ----

def _steady(finished: list[tuple[int, float, float | None, float]], skip: int) -> dict[str, Any]:
    """Mean TTFT, TPOT and E2E (ms) of the requests past the first and last `skip` (warm-up and drain)."""
    rows = [r for r in finished if skip <= r[0] < max(finished)[0] + 1 - skip] or finished
    return {"ttft_ms": 1000 * statistics.fmean(r[1] for r in rows),
            "tpot_ms": 1000 * statistics.fmean(r[2] for r in rows if r[2] is not None),
            "e2e_ms": 1000 * statistics.fmean(r[3] for r in rows)}


def _setup(model: Any, gpu: str, engine: dict[str, Any], case: dict[str, Any], notes: list[str]) -> Any:
    """kvbudget's setup for an engine with aiconfigurator's flags; where kvbudget finds vLLM would refuse to start
    (no --max-model-len given: the model's whole context must fit), the note says so and the engine is simulated
    with --max-model-len ISL + OSL, the least its requests need."""
    settings = {"engine": f"vllm@{case['vllm']}", "gpu": gpu, "tp": engine["tp"], "pp": engine["pp"],
                "max_num_seqs": engine["max_num_seqs"],
                "max_num_batched_tokens": engine["max_num_batched_tokens"], "utilization": UTILIZATION}
    try:
        return setup_for(model, max_model_len=engine["max_model_len"], **settings)
    except KVBudgetError as exc:
        notes.append(f"{engine['mode']} engine as written would not start: {str(exc).split(':', 1)[1].strip()}; "
                     f"simulated with --max-model-len {case['isl'] + case['osl']}")
        return setup_for(model, max_model_len=case["isl"] + case["osl"], **settings)


def simulate_agg(case: dict[str, Any], model: Any) -> dict[str, Any]:
    chosen = case["agg"]
    engine, bs = chosen["engines"][0], int(chosen["row"]["bs"])
    notes: list[str] = []
    setup = _setup(model, GPUS[case["system"]], engine, case, notes)
    reqs = [Request(arrival=0.0, prompt_tokens=case["isl"], output_tokens=case["osl"], id=str(i))
            for i in range(6 * bs)]
    finished: list[tuple[int, float, float | None, float]] = []
    simulate(model, reqs, setup=setup, max_concurrency=bs,
             on_finish=lambda r, ttft, tpot, e2e: finished.append((int(r.id), ttft, tpot, e2e)))
    got = _steady(finished, bs)
    got["tokens_s_gpu"] = bs * case["osl"] / (got["e2e_ms"] / 1000) / setup.gpus
    got["kv_tokens"] = [setup.token_slots]
    got["notes"] = notes
    return got


def simulate_disagg(case: dict[str, Any], model: Any) -> dict[str, Any]:
    chosen = case["disagg"]
    row, (pre, dec) = chosen["row"], chosen["engines"]
    gpu, notes = GPUS[case["system"]], list[str]()
    pools = [Pool(name="prefill", setup=_setup(model, gpu, pre, case, notes), replicas=int(row["(p)workers"]),
                  role=Role.PREFILL),
             Pool(name="decode", setup=_setup(model, gpu, dec, case, notes), replicas=int(row["(d)workers"]),
                  role=Role.DECODE)]
    rate, n = float(row["request_rate"]), 6 * int(row["concurrency"])
    reqs = [Request(arrival=i / rate, prompt_tokens=case["isl"], output_tokens=case["osl"], id=str(i))
            for i in range(n)]
    finished: list[tuple[int, float, float | None, float]] = []
    simulate_fleet(model, reqs, pools, kv_link="nvlink",
                         on_finish=lambda _i, r, ttft, tpot, e2e: finished.append((int(r.id), ttft, tpot, e2e)))
    got = _steady(finished, n // 6)
    # served in the steady window (from the arrival of the n/6-th request to that of the 5n/6-th): the requests
    # finishing in it (open loop: a request finishes at its arrival plus its E2E) times OSL, per GPU
    start, end = (n // 6) / rate, (n - n // 6) / rate
    done = sum(start <= int(i) / rate + e2e < end for i, _, _, e2e in finished)
    got["tokens_s_gpu"] = done * case["osl"] / (end - start) / sum(p.replicas * p.gpus for p in pools)
    got["kv_tokens"] = [p.setup.token_slots for p in pools]
    got["notes"] = notes
    return got


def aic_choice(case: dict[str, Any]) -> tuple[str, float, int]:
    """aiconfigurator's own answer for the case on its 8 GPUs: the mode of the higher tokens/s/GPU (its
    `chosen_exp = max(best_throughputs, ...)`, aiconfigurator/cli/main.py), the request rate that choice predicts
    over the 8 GPUs (aggregated: one replica's `request_rate` times the replicas 8 GPUs hold; disaggregated: its
    `request_rate`, already the whole) and the requests in flight at it (its `concurrency`, times the replicas)."""
    mode = max((m for m in ("agg", "disagg") if case.get(m)), key=lambda m: case[m]["row"]["tokens/s/gpu"])
    row = case[mode]["row"]
    copies = TOTAL_GPUS // int(row["num_total_gpus"]) if mode == "agg" else 1
    return mode, float(row["request_rate"]) * copies, int(row["concurrency"]) * copies


def own_choice(case: dict[str, Any], model: Any) -> dict[str, Any]:
    """kvbudget's own choice for the case (`kvbudget.simulation.recommend.recommend`): the same model and vLLM
    release, the case's GPU only, at most its 8 GPUs, one price for the GPU (so cost ranks by GPUs), the KV cache
    in the model's dtype (aiconfigurator's rows: kvcache bfloat16), memory fraction 0.9, max_model_len ISL + OSL;
    requests of exactly ISL and OSL tokens arriving evenly at the rate aiconfigurator's choice predicts
    (`aic_choice`), SEARCH_SPAN x its concurrency of them; the objectives the case's TTFT and TPOT on the means
    (`ttft_mean`, `tpot_mean`: aiconfigurator's targets are on its steady-state figures, one value per
    configuration, which a mean over the run matches best; the run's mean includes its warm-up and drain)."""
    from kvbudget.commands.simulate import SimulateRequest, simulation_ask
    from kvbudget.simulation.recommend import Space, recommend

    mode, rate, concurrency = aic_choice(case)
    n = SEARCH_SPAN * concurrency
    ask = simulation_ask(SimulateRequest(model=MODELS[case["model"]], engine=f"vllm@{case['vllm']}",
                                         max_model_len=str(case["isl"] + case["osl"])), model)
    reqs = [Request(arrival=i / rate, prompt_tokens=case["isl"], output_tokens=case["osl"], id=str(i))
            for i in range(n)]
    slo = {"ttft_mean": case["ttft_ms"] / 1000, "tpot_mean": case["tpot_ms"] / 1000}
    space = Space(gpus=(GPUS[case["system"]],), max_gpus=case["total_gpus"], kv_dtypes=("auto",),
                  gpu_memory_utilization=(UTILIZATION,))
    began = time.perf_counter()
    found = recommend(ask, reqs, slo, space, {None: 1.0}, kv_link="nvlink", backend="serial")
    asked = {"aiconfigurator_mode": mode, "rate": round(rate, 4), "requests": n, "arrivals": "evenly spaced",
             "slo_s": slo, "gpu": GPUS[case["system"]], "max_gpus": case["total_gpus"], "kv_dtype": "auto",
             "gpu_memory_utilization": UTILIZATION, "max_model_len": case["isl"] + case["osl"],
             "engine": f"vllm@{case['vllm']}", "kv_link": "nvlink", "price": "one for the GPU"}
    out: dict[str, Any] = {"kvbudget_version": kvbudget.__version__, "asked": asked,
                           "candidates": {"listed": found.listed, "pruned": sum(p.candidates for p in found.pruned),
                                          "simulated": len(found.tried), "skipped": found.skipped},
                           "seconds": round(time.perf_counter() - began, 1)}
    best = found.best
    if best is None:
        return {**out, "candidate": None, "binding": found.binding}
    c = best.candidate
    return {**out, "label": c.label(), "candidate": c.to_dict(),
            "values_s": {k: v for k, v in best.measured.values.items() if v is not None},
            "tokens_s_gpu": best.measured.output_tokens / best.measured.duration_s / c.gpus}


def _own_config(c: dict[str, Any]) -> str:
    """A candidate in the table's words (as _config writes aiconfigurator's)."""
    shape = f"tp{c['tp']}pp{c['pp']}"
    if c["disaggregated"]:
        return f"{c['prefill_replicas']}P {shape} + {c['decode_replicas']}D {shape}"
    return f"{shape} x{c['replicas']}"


def _config(mode: str, chosen: dict[str, Any]) -> str:
    row = chosen["row"]
    if mode == "agg":
        return f"{row['parallel'].split('dp')[0]} bs{row['bs']} x{TOTAL_GPUS // row['num_total_gpus']}"
    return (f"{row['(p)workers']}P {row['(p)parallel'].split('dp')[0]} + {row['(d)workers']}D "
            f"{row['(d)parallel'].split('dp')[0]} bs{row['(d)bs']}")


def _vllm(case: dict[str, Any]) -> str:
    """The vLLM release aiconfigurator's database measured (its rows' `version`)."""
    row = (case["agg"] or case["disagg"])["row"]
    return str(row.get("version") or row["(p)version"])


def record(doc: dict[str, Any], search: bool, aic: Path | None) -> bool:
    """kvbudget's own choice for each case (searched where `search` or never recorded) and, with `aic`,
    aiconfigurator's estimate of it, into the cases; an estimate is kept while the choice it was asked about is.
    Whether anything changed."""
    changed = False
    for case in doc["cases"]:
        case["vllm"] = _vllm(case)
        before = case.get("kvbudget") or {}
        if search or not before:
            print(f"searching {case['id']} with kvbudget ...", flush=True)
            own = own_choice(case, kvbudget.load_model(MODELS[case["model"]]))
            kept = before.get("aiconfigurator_estimate")
            if own["candidate"] and kept and kept["asked"] == estimate_ask(case, own):
                own["aiconfigurator_estimate"] = kept
            case["kvbudget"], changed = own, True
        own = case["kvbudget"]
        if aic is not None and own["candidate"]:
            own["aiconfigurator_estimate"] = aiconfigurator_estimate(aic, estimate_ask(case, own))
            changed = True
    return changed


def own_table(doc: dict[str, Any]) -> list[str]:
    """kvbudget's own choice beside aiconfigurator's, from the data file alone (a Markdown table, as
    docs/accuracy.md shows it): each one's configuration, GPUs and TTFT/TPOT (ms) at the rate aiconfigurator's
    choice predicts on its 8 GPUs, and aiconfigurator's estimate of kvbudget's choice."""
    rows = ["| case | rate (req/s) | aiconfigurator chose (8 GPUs) | its TTFT / TPOT | kvbudget chose | GPUs | "
            "kvbudget's TTFT / TPOT (mean) | aiconfigurator's TTFT / TPOT of it | aiconfigurator's rate for it |",
            "|---|---:|---|---|---|---:|---|---|---:|"]
    for case in doc["cases"]:
        own = case["kvbudget"]
        mode = own["asked"]["aiconfigurator_mode"]
        chosen = case[mode]
        row = chosen["row"]
        theirs = f"{_config(mode, chosen)} ({mode})"
        if own["candidate"] is None:
            rows.append(f"| {case['id']} | {own['asked']['rate']:.1f} | {theirs} | {row['ttft']:.0f} / "
                        f"{row['tpot']:.1f} | none met the targets: {own['binding']} | | | | |")
            continue
        c, v, est = own["candidate"], own["values_s"], own.get("aiconfigurator_estimate")
        if est:
            copies = c["replicas"] if est["asked"]["mode"] == "agg" else 1
            reverse = f"{est['ttft_ms']:.0f} / {est['tpot_ms']:.1f}"
            rate = f"{est['request_rate'] * copies:.1f}"
        else:
            reverse, rate = "not asked (--refresh)", ""
        rows.append(f"| {case['id']} | {own['asked']['rate']:.1f} | {theirs} | {row['ttft']:.0f} / "
                    f"{row['tpot']:.1f} | {_own_config(c)} | {c['gpus']} | {1000 * v['ttft_mean']:.0f} / "
                    f"{1000 * v['tpot_mean']:.1f} | {reverse} | {rate} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refresh", type=Path, metavar="AIC_VENV",
                    help="a virtual environment with aiconfigurator installed: ask it again (its choices, and its "
                         "estimate of kvbudget's), search again with kvbudget, rewrite cases.json")
    ap.add_argument("--search", action="store_true",
                    help="search again with kvbudget (minutes) and record its choices in cases.json")
    ap.add_argument("--table", action="store_true",
                    help="print only the table of both tools' choices, from cases.json (as docs/accuracy.md shows)")
    a = ap.parse_args()
    doc = json.loads(CASES.read_text()) if CASES.exists() else {}
    if a.refresh:
        doc.update(ask_aiconfigurator(a.refresh))
    if not a.table and record(doc, a.search or bool(a.refresh), a.refresh):
        for case in doc["cases"]:
            case.pop("vllm", None)
        CASES.write_text(json.dumps(doc, indent=1) + "\n")
    if a.table:
        print("\n".join(own_table(doc)))
        return
    print(f"{doc['aiconfigurator_version']} (its vLLM database) beside kvbudget {kvbudget.__version__}"
          f"; TTFT, TPOT in ms (steady-state means), output tokens/s per GPU")
    head = (f"{'case':24} {'mode':6} {'aiconfigurator chose':28} {'tok/s/GPU aic':>13} {'kvb':>7} "
            f"{'TTFT aic':>9} {'kvb':>7} {'TPOT aic':>9} {'kvb':>6}")
    print(head)
    kv_rows = []
    sims: dict[str, Callable[[dict[str, Any], Any], dict[str, Any]]] = {"agg": simulate_agg,
                                                                        "disagg": simulate_disagg}
    for case in doc["cases"]:
        model = kvbudget.load_model(MODELS[case["model"]])
        case["vllm"] = _vllm(case)
        for mode in ("agg", "disagg"):
            chosen = case.get(mode)
            if not chosen:
                print(f"{case['id']:24} {mode:6} {'(none met the SLO)':28}")
                continue
            row, ours = chosen["row"], sims[mode](case, model)
            print(f"{case['id']:24} {mode:6} {_config(mode, chosen):28} {row['tokens/s/gpu']:13.0f} "
                  f"{ours['tokens_s_gpu']:7.0f} {row['ttft']:9.1f} {ours['ttft_ms']:7.1f} {row['tpot']:9.2f} "
                  f"{ours['tpot_ms']:6.2f}")
            for note in ours["notes"]:
                print(f"{'':31} note: {note}")
            for engine, tokens in zip(chosen["engines"], ours["kv_tokens"]):
                kv_rows.append((case["id"], f"{mode}/{engine['mode']}", engine, tokens))
    print("\nEach one's own choice at the rate aiconfigurator's predicts on its 8 GPUs (kvbudget's searched as "
          "recorded in cases.json; TTFT / TPOT in ms):")
    print("\n".join(own_table(doc)))
    print("\nKV budget of each engine aiconfigurator would start (tokens the cache holds, GPU memory fraction "
          f"{UTILIZATION}):")
    print(f"{'case':24} {'engine':14} {'TP':>2} {'seqs':>5} {'batched':>7} {'aiconfigurator':>14} {'kvbudget':>9} "
          f"{'aic vs kvb':>10}")
    gaps = []
    for cid, where, engine, tokens in kv_rows:
        theirs = engine["aiconfigurator_kv"]["tokens"]
        gaps.append(theirs / tokens - 1)
        print(f"{cid:24} {where:14} {engine['tp']:>2} {engine['max_num_seqs']:>5} "
              f"{engine['max_num_batched_tokens']:>7} {theirs:>14,} {tokens:>9,} {gaps[-1]:>+10.1%}")
    print(f"aiconfigurator's KV budget against kvbudget's plan: median {statistics.median(gaps):+.1%}, "
          f"from {min(gaps):+.1%} to {max(gaps):+.1%} over {len(gaps)} engines")


if __name__ == "__main__":
    main()
