"""A `Deployment` written out as files that run: the engine's command line per pool (from the engine's own
package, `Launches`), llm-d's Helm values, KServe's LLMInferenceService, the guard's configuration per pool, the
Prometheus alerts, and a README saying what each is and how to apply it.

Each writer is a pure function of the deployment (and of each pool's Setup, the memory plan it was simulated
with); `write_all` alone touches the disk, through `kvbudget.files.write_files`: every file whole or none of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvbudget import validate
from kvbudget.deploy.guarded import alerts_yaml, guard_yaml, with_queue_limits
from kvbudget.deploy.manifests import dynamo_graph, kserve_service, llmd_values
from kvbudget.engines import ENGINES, get_engine
from kvbudget.engines.launch import Launch, Launches, RunsUnderDynamo, RunsUnderKServe
from kvbudget.engines.scheduling.setup import Role
from kvbudget.errors import KVBudgetError
from kvbudget.files import write_files

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment, PoolPlan
    from kvbudget.engines.scheduling.setup import Setup
    from kvbudget.model.spec import ModelSpec

SetupForPool = Callable[["PoolPlan"], "Setup"]


@dataclass(frozen=True, kw_only=True)
class DeployFile:
    """One file of the set: its name in the folder, its text, what it is and how to apply it."""

    name: str
    text: str
    what: str
    apply: str


def launcher(deployment: Deployment) -> Launches:
    """The deployment's engine as a writer of its command line; refused in one line where it has none."""
    engine = get_engine(deployment.engine)
    if not isinstance(engine, Launches):
        able = ", ".join(name for name, e in ENGINES.items() if isinstance(e, Launches))
        raise KVBudgetError(f"engine {engine.name}: kvbudget writes no command line for it; give one of {able}",
                            param="engine")
    return engine


def _model(deployment: Deployment) -> ModelSpec:
    """The deployment's model, loaded by its id (a catalog name, a config file or a Hub id)."""
    from kvbudget.model.load import load_model

    try:
        return load_model(deployment.model)
    except KVBudgetError as exc:
        if exc.param is not None:
            raise
        raise type(exc)(f"model {exc}", param="model") from None


def checkpoint_bytes(deployment: Deployment) -> int:
    """The model's weights as its checkpoint stores them (the safetensors' own sizes where kvbudget can read them,
    else from the parameter count): what the model's storage must hold (the default `model_bytes`)."""
    from kvbudget.model.weights import model_weights

    return model_weights(_model(deployment)).total_bytes


def planned_setup(deployment: Deployment, pool: PoolPlan) -> Setup:
    """The pool's Setup from the planner and the engine, as `simulate` would run it (the default `setup_for_pool`)."""
    from kvbudget.simulation.run import setup_for

    engine = deployment.engine + (f"@{deployment.release}" if deployment.release else "")
    return setup_for(_model(deployment), engine, gpu=pool.gpu, tp=pool.tp, pp=pool.pp,
                     kv_dtype=pool.kv_dtype, max_model_len=pool.max_model_len, block_size=pool.block_size,
                     max_num_seqs=pool.max_num_seqs, max_num_batched_tokens=pool.max_num_batched_tokens,
                     prefix_caching=pool.prefix_caching, utilization=pool.gpu_memory_utilization,
                     offload_memory=pool.offload_bytes, speculative=pool.speculative, expert_parallel=pool.expert_ranks,
                     extensible_kv_cache=pool.extensible_kv_cache)


def _suffix(pool: PoolPlan) -> str:
    return "" if pool.role is Role.BOTH else f"-{pool.role.value}"


def _ranks(pool: PoolPlan) -> str:
    return f" x {pool.expert_ranks} expert-parallel ranks" if pool.expert_ranks > 1 else ""


def _kind(pool: PoolPlan) -> str:
    return "co-located" if pool.role is Role.BOTH else pool.role.value


def serve_script(deployment: Deployment, pool: PoolPlan, launch: Launch) -> str:
    """One replica's start as a shell script (`sh serve.sh`), with what the engine's flags follow."""
    notes = "".join(f"# note: {n}\n" for n in launch.notes)
    return (f"#!/bin/sh\n# {deployment.model} on {deployment.engine}: one replica of {pool.replicas} "
            f"({_kind(pool)}), {pool.tp} x {pool.pp}{_ranks(pool)} {pool.gpu}, written by kvbudget.deploy\n"
            f"# {launch.source}\n{notes}exec {launch.shell}\n")


def files(deployment: Deployment, setups: dict[Role, Setup], model_bytes: int) -> tuple[DeployFile, ...]:
    """Every file of the set (pure): the pools' queue limits filled in from their setups first; `model_bytes`: the
    checkpoint's size, which the model's storage must hold."""
    engine = launcher(deployment)
    pools = tuple(with_queue_limits(p, setups[p.role]) for p in deployment.pools)
    deployment = replace(deployment, pools=pools)
    said: dict[str, None] = {}  # what the engines' command lines could not express, once each, in order

    def launch(pool: PoolPlan, port: int) -> Launch:
        done = engine.command(pool, replace(deployment, port=port))
        said.update(dict.fromkeys(done.notes))
        return done

    out = []
    for pool in pools:
        tail = _suffix(pool)
        out.append(DeployFile(name=f"serve{tail}.sh",
                              text=serve_script(deployment, pool, launch(pool, deployment.port)),
                              what=f"the engine's command line for each {_kind(pool)} replica",
                              apply=f"`sh serve{tail}.sh` on each of the {pool.replicas} replicas' machines"))
        out.append(DeployFile(name=f"guard{tail}.yaml", text=guard_yaml(deployment, pool, setups[pool.role]),
                              what=f"the guard's configuration for one {_kind(pool)} replica",
                              apply=f"`kvbudget guard --config guard{tail}.yaml --upstream http://REPLICA:"
                                    f"{deployment.port}` beside each replica (or in front of one)"))
    out += [DeployFile(name="alerts.yaml", text=alerts_yaml(deployment),
                       what="Prometheus alerting rules on the engine's KV usage at the guard's levels",
                       apply="add it to Prometheus' rule_files (`promtool check rules alerts.yaml` checks it)"),
            DeployFile(name="llm-d-values.yaml", text=llmd_values(deployment, launch, model_bytes),
                       what="values for llm-d's modelservice Helm chart",
                       apply="`helm install NAME llm-d-modelservice/llm-d-modelservice -f llm-d-values.yaml`")]
    if isinstance(engine, RunsUnderKServe):
        served = engine

        def flags(pool: PoolPlan) -> Launch:
            return served.kserve_args(pool, deployment)

        out.append(DeployFile(name="kserve-llminferenceservice.yaml", text=kserve_service(deployment, flags),
                              what="a KServe LLMInferenceService (KServe's templates start the engine with these "
                                   "settings)", apply="`kubectl apply -f kserve-llminferenceservice.yaml`"))
    else:
        able = ", ".join(name for name, e in ENGINES.items() if isinstance(e, RunsUnderKServe))
        said[f"no LLMInferenceService: KServe's templates start {able} only"] = None
    if deployment.disaggregated and isinstance(engine, RunsUnderDynamo):
        worker = engine

        def dynamo(pool: PoolPlan) -> Launch:
            done = worker.dynamo_worker(pool, deployment)
            said.update(dict.fromkeys(f"Dynamo: {n}" for n in done.notes))
            return done

        try:
            out.append(DeployFile(name="dynamo-graphdeployment.yaml",
                                  text=dynamo_graph(deployment, dynamo, engine.dynamo_framework),
                                  what="an NVIDIA Dynamo DynamoGraphDeployment (its frontend and a worker per pool)",
                                  apply="`kubectl apply -f dynamo-graphdeployment.yaml` where Dynamo's operator runs"))
        except KVBudgetError as exc:  # no Dynamo runtime for the release: the other files still serve
            said[f"no DynamoGraphDeployment: {exc}"] = None
    elif deployment.disaggregated:
        able = ", ".join(name for name, e in ENGINES.items() if isinstance(e, RunsUnderDynamo))
        said[f"no DynamoGraphDeployment: kvbudget writes Dynamo's workers for {able} only"] = None
    return (*out, DeployFile(name="README.md", text=readme(deployment, out, tuple(said)), what="this list",
                             apply="read it"))


def readme(deployment: Deployment, written: list[DeployFile], said: tuple[str, ...] = ()) -> str:
    """What the folder holds, how to apply each file, and what the deployment assumes."""
    lines = [f"# {deployment.model} on {deployment.engine}", "",
             f"Written by kvbudget.deploy: {deployment.gpus} GPUs in all, "
             + ("prefill and decode disaggregated over " + str(deployment.kv_link) if deployment.disaggregated
                else "co-located prefill and decode") + f", router {deployment.router}.", "",
             "| pool | replicas | GPU | TP x PP | max_num_seqs | max_num_batched_tokens | max_model_len | queue limits "
             "(requests, prompt tokens) |", "|---|---|---|---|---|---|---|---|"]
    for p in deployment.pools:
        lines.append(f"| {p.role.value} | {p.replicas} | {p.gpu} | {p.tp} x {p.pp}{_ranks(p)} | {p.max_num_seqs} | "
                     f"{p.max_num_batched_tokens} | {p.max_model_len} | {p.max_num_queued_reqs}, "
                     f"{p.max_num_queued_tokens} |")
    lines += ["", "## Files", ""]
    lines += [f"- `{f.name}`: {f.what}; {f.apply}." for f in written]
    lines += ["", "The engine's queue limits are the guard's reject level (95% of the KV cache) in requests and "
              "tokens (max_num_seqs plus the requests of max_model_len it holds; the tokens it holds), so the "
              "engine refuses no earlier than the guard. The manifests leave the cluster's gateway to their charts' "
              "defaults."]
    if deployment.notes or said:
        lines += ["", "## Notes", "", *(f"- {n}" for n in (*deployment.notes, *said))]
    return "\n".join(lines) + "\n"


def write_all(deployment: Deployment, directory: str, *, setup_for_pool: SetupForPool | None = None,
              model_bytes: int | None = None, force: bool = False, param: str = "directory") -> tuple[str, ...]:
    """Write every file of `deployment` into `directory` (an existing folder), whole or none; the paths written.
    `setup_for_pool`: each pool's Setup as it was simulated (None: planned here from the pool's settings);
    `model_bytes`: the checkpoint's size (None: `checkpoint_bytes`); `force` replaces files that exist; `param`
    names the folder in errors (the front end's own parameter)."""
    if not os.path.isdir(directory):
        raise KVBudgetError(f"{param} {directory}: not an existing folder; create it first", param=param)
    if model_bytes is not None:
        validate.size(model_bytes, "model_bytes", 1)
    engine = launcher(deployment)  # an engine without a command line is refused before any planning,
    for pool in deployment.pools:  # and so is a setting its command line cannot take
        engine.command(pool, deployment)
    setups = {p.role: (setup_for_pool or (lambda pool: planned_setup(deployment, pool)))(p) for p in deployment.pools}
    written = files(deployment, setups, model_bytes if model_bytes is not None else checkpoint_bytes(deployment))
    paths = tuple(os.path.join(directory, f.name) for f in written)
    write_files([(path, f.text) for path, f in zip(paths, written, strict=True)], param, force)
    return paths


__all__ = ["DeployFile", "checkpoint_bytes", "files", "launcher", "planned_setup", "readme", "write_all"]
