"""`vllm serve` for one pool of a deployment, per release (the flags: vllm/engine/arg_utils.py
EngineArgs.add_cli_args and the OpenAI server's cli_args.py of each release; their lists, extracted by
scripts/vllm_flags.py, are flags.json beside this module, against which the tests check every flag written here).

- --kv-offloading-size (GiB over every rank of a replica: config/cache.py `kv_offloading_size`) with
  --kv-offloading-backend native: from 0.12 (absent from 0.11.0's arg_utils.py).
- --max-num-queued-reqs / --max-num-queued-tokens: from 0.29 (queued.py).
- disaggregated pools: --kv-transfer-config with the NIXL connector (distributed/kv_transfer/kv_connector/
  factory.py registers "NixlConnector" from 0.9; kv_role "kv_both" on both sides, as vLLM's disaggregated examples
  run it: config/kv_transfer.py's KVProducer and KVConsumer both take it).
- --kv-cache-dtype takes the release's CacheDType literal (vllm/config.py, config/cache.py from 0.10: bfloat16
  from 0.11, float16 from 0.18).
- --no-enable-prefix-caching: enable_prefix_caching is `bool | None`, which get_kwargs makes a
  BooleanOptionalAction from 0.8.5; so is 0.34's enable_extensible_kv_cache, whose --no- form is written where the
  pool was planned without the extensible KV cache (from 0.34 only: earlier releases size the cache that way).
- --gpu-memory-utilization: the share planned, 1.0 on 0.34 by default (config/cache.py
  resolved_gpu_memory_utilization with the extensible KV cache: a cap on the cache, which measure_kv_cache_bytes
  sizes from the memory free after warm-up).
- --speculative-config '{"method": ..., "num_speculative_tokens": K, "model": ...}' (every release read defines the
  flag): SpeculativeConfig's fields `method`, `num_speculative_tokens` and `model` (vllm/config/speculative.py; its
  SpeculativeMethod literal names draft_model with an underscore, "mtp" among its MTPModelTypes in 0.18.1, 0.28.0
  and 0.32.0), written for the methods kvbudget sizes on the release (speculative.methods: mtp from 0.20, every
  one at 0.32), as the pool was planned.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from kvbudget.engines.launch import Launch, refuse
from kvbudget.engines.scheduling.setup import Role
from kvbudget.engines.vllm import speculative
from kvbudget.engines.vllm.queued import FIRST as QUEUED_FIRST
from kvbudget.engines.vllm.releases import DEFAULT, EXTENSIBLE_FROM, NEWEST, parse_release
from kvbudget.units import GIB

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment, PoolPlan
    from kvbudget.speculative import Speculative

OFFLOAD_FIRST = (0, 12)  # --kv-offloading-size
NIXL_FIRST = (0, 9)  # the NixlConnector
LAUNCH_OLDEST = (0, 8)  # the oldest release whose flags were extracted (0.8.5)
NIXL = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":"))


@cache
def flag_data() -> dict[str, Any]:
    """flags.json: per release, its source files, its flags, its negatable flags and its KV cache dtypes."""
    return json.loads(resources.files("kvbudget.engines.vllm").joinpath("flags.json").read_text())


def release_data(version: tuple[int, ...]) -> tuple[str, dict[str, Any]]:
    """The newest release read whose (major, minor) is at most `version`'s, and its record."""
    known = flag_data()["releases"]
    return max(((name, rec) for name, rec in known.items() if tuple(map(int, name.split(".")))[:2] <= version[:2]),
               key=lambda item: tuple(map(int, item[0].split("."))))


def version_of(deployment: Deployment) -> tuple[int, ...]:
    """The release the deployment names (kvbudget's default where it names none), within those read."""
    version = parse_release(deployment.release) if deployment.release else DEFAULT
    if version < LAUNCH_OLDEST:
        raise refuse("release", f"vLLM {deployment.release}: kvbudget writes `vllm serve` for vLLM 0.8 to "
                                f"{NEWEST[0]}.{NEWEST[1]} (the releases whose flags it has read); give one of them")
    return version


def queue_flags(max_reqs: int | None, max_tokens: int | None, version: tuple[int, ...], shown: str) -> Launch:
    """--max-num-queued-reqs and --max-num-queued-tokens where given and the release has them (queued.py), else a
    note; the flags alone (ShedsQueue)."""
    argv: list[str] = []
    notes = []
    for flag, value in (("--max-num-queued-reqs", max_reqs), ("--max-num-queued-tokens", max_tokens)):
        if value is not None and version >= QUEUED_FIRST:
            argv += [flag, str(value)]
        elif value is not None:
            notes.append(f"vLLM {shown} has no {flag} (from 0.29): the guard's reject level stands in for it")
    return Launch(argv=tuple(argv), image="", notes=tuple(notes),
                  source="vllm/v1/engine/async_llm.py check_admission (0.29 on): 503 past either limit")


def command(pool: PoolPlan, deployment: Deployment) -> Launch:
    version = version_of(deployment)
    name, data = release_data(version)
    shown = deployment.release or ".".join(map(str, version))
    if pool.kv_dtype not in data["kv_cache_dtypes"]:
        raise refuse("kv_dtype", f"{pool.kv_dtype!r}: vLLM {shown}'s --kv-cache-dtype takes "
                                 f"{', '.join(data['kv_cache_dtypes'])}")
    argv = ["vllm", "serve", deployment.model]
    if deployment.served_name:
        argv += ["--served-model-name", deployment.served_name]
    argv += ["--port", str(deployment.port), "--tensor-parallel-size", str(pool.tp),
             "--pipeline-parallel-size", str(pool.pp), "--max-num-seqs", str(pool.max_num_seqs),
             "--max-num-batched-tokens", str(pool.max_num_batched_tokens), "--max-model-len", str(pool.max_model_len),
             "--gpu-memory-utilization", repr(pool.gpu_memory_utilization), "--kv-cache-dtype", pool.kv_dtype]
    if pool.block_size is not None:
        argv += ["--block-size", str(pool.block_size)]
    argv.append("--enable-prefix-caching" if pool.prefix_caching else "--no-enable-prefix-caching")
    if not pool.extensible_kv_cache and version >= EXTENSIBLE_FROM:  # earlier releases size the cache that way
        argv.append("--no-enable-extensible-kv-cache")
    if pool.expert_ranks > 1:
        argv += ["--data-parallel-size", str(pool.expert_ranks), "--enable-expert-parallel"]
    if pool.offload_bytes is not None:
        if version < OFFLOAD_FIRST:
            raise refuse("offload_bytes", f"vLLM {shown} has no --kv-offloading-size (from 0.12); give a later "
                                          "release or no host tier")
        argv += ["--kv-offloading-size", repr(pool.offload_bytes / GIB), "--kv-offloading-backend", "native"]
    if pool.speculative is not None:
        argv += ["--speculative-config", speculative_config(pool.speculative, version, shown)]
    queued = queue_flags(pool.max_num_queued_reqs, pool.max_num_queued_tokens, version, shown)
    argv += queued.argv
    notes = list(queued.notes)
    if pool.role is not Role.BOTH:
        if version < NIXL_FIRST:
            raise refuse("kv_link", f"vLLM {shown} has no NIXL connector (from 0.9) for disaggregated prefill and "
                                    "decode; give a later release")
        argv += ["--kv-transfer-config", NIXL]
    source = f"vLLM {shown}: flags as in {data['source']} (vllm {name} read)"
    image = f"vllm/vllm-openai:v{deployment.release or name}"  # the project's image, tagged v<release>
    return Launch(argv=tuple(argv), image=image, pd_connector="nixlv2" if pool.role is not Role.BOTH else "",
                  notes=tuple(notes), source=source)


def speculative_config(spec: Speculative, version: tuple[int, ...], shown: str) -> str:
    """--speculative-config's JSON for `spec` on `version` (refused for a method kvbudget does not size there)."""
    methods = speculative.methods(version, v0=False)
    if spec.method not in methods:
        takes = ", ".join(methods) or "none (mtp from 0.20, every method at 0.32)"
        raise refuse("speculative", f"{spec.method}: kvbudget writes vLLM {shown}'s --speculative-config for the "
                                    f"methods it sizes there: {takes}; give another method or release")
    config: dict[str, Any] = {"method": spec.method.value.replace("-", "_"), "num_speculative_tokens": spec.num_tokens}
    if spec.draft_id is not None:
        config["model"] = spec.draft_id
    return json.dumps(config, separators=(",", ":"))


# NVIDIA Dynamo's releases and the vLLM each one's vllm-runtime image bundles (ai-dynamo/aiconfigurator
# src/aiconfigurator/generator/config/backend_version_matrix.yaml at 095f58a, Apache-2.0), newest first. Dynamo 1.0
# gave its vLLM worker --disaggregation-mode (prefill | decode) in place of --is-prefill-worker / --is-decode-worker
# (aiconfigurator's generator/dynamo_features.py, vllm_worker_role_args).
DYNAMO_VLLM = (((1, 3, 0), "0.24.0"), ((1, 2, 0), "0.20.1"), ((1, 1, 0), "0.19.0"), ((1, 0, 0), "0.16.0"),
               ((0, 9, 0), "0.14.1"), ((0, 8, 1), "0.12.0"), ((0, 7, 1), "0.11.0"))
DISAGGREGATION_MODE = (1, 0, 0)


def dynamo_worker(pool: PoolPlan, deployment: Deployment) -> Launch:
    """`python3 -m dynamo.vllm` for one replica of `pool`: the vLLM flags of the release Dynamo's runtime image
    bundles (the newest Dynamo whose vLLM is at most the release planned), without the HTTP port (Dynamo's
    frontend serves), with the worker's role."""
    planned = version_of(deployment)
    found = next(((dyn, vllm) for dyn, vllm in DYNAMO_VLLM
                  if tuple(map(int, vllm.split(".")))[:2] <= planned[:2]), None)
    if found is None:
        raise refuse("release", f"vLLM {deployment.release}: the oldest Dynamo runtime kvbudget knows bundles vLLM "
                                f"{DYNAMO_VLLM[-1][1]}; give that release or a later one")
    dynamo, bundled = found
    base = command(pool, replace(deployment, release=bundled))
    argv = list(base.argv[3:])
    at = argv.index("--port")
    del argv[at:at + 2]
    if pool.role is not Role.BOTH:
        argv += (["--disaggregation-mode", pool.role.value] if dynamo >= DISAGGREGATION_MODE
                 else [f"--is-{pool.role.value}-worker"])
    shown = ".".join(map(str, dynamo))
    notes = list(base.notes)
    if tuple(map(int, bundled.split(".")))[:2] != planned[:2]:
        notes.append(f"Dynamo {shown}'s runtime image bundles vLLM {bundled}, not the "
                     f"{deployment.release or '.'.join(map(str, DEFAULT))} planned: flags written for {bundled}")
    return Launch(argv=("python3", "-m", "dynamo.vllm", "--model", deployment.model, *argv),
                  image=f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{shown}", notes=tuple(notes),
                  source=f"Dynamo {shown} (vLLM {bundled}): {base.source}")



# What KServe's LLMInferenceService templates (kserve/kserve config/llmisvcconfig/config-llm-template.yaml and the
# prefill and decode templates, at aaac4e2) give `vllm serve` themselves: the model (/mnt/models, from spec.model's
# storage), --served-model-name, --port (8000, or 8001 behind the decode side's routing sidecar) and
# --tensor-parallel-size (from spec.parallelism.tensor); the container's args are appended (`$@`).
KSERVE_SETS = ("--served-model-name", "--port", "--tensor-parallel-size")


def kserve_args(pool: PoolPlan, deployment: Deployment) -> Launch:
    """The pool's flags KServe's templates do not set, as the main container's args."""
    base = command(pool, deployment)
    flags = list(base.argv[3:])
    for flag in KSERVE_SETS:
        if flag in flags:
            at = flags.index(flag)
            del flags[at:at + 2]
    return Launch(argv=tuple(flags), image=base.image, pd_connector=base.pd_connector, notes=base.notes,
                  source=f"{base.source}; KServe's llmisvc templates set the model, its name, the port and the tensor "
                         "parallel size")
