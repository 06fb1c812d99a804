"""Kubernetes manifests for a deployment, each from its project's own schema (the copies the tests validate
against: tests/data/schemas/README.md):

- llm-d's modelservice Helm chart values (llm-d-incubation/llm-d-modelservice charts/llm-d-modelservice/
  values.yaml and values.schema.json, chart v0.4.12): `decode` is the co-located pool or the decode side,
  `prefill` the prefill side; each container runs the engine's own command (`modelCommand: custom`); the routing
  sidecar (routing.proxy) runs in front of decode only when prefill is disaggregated, with the engine's connector
  (`Launch.pd_connector`), and then the decode engine listens on the sidecar's targetPort (8200, the chart's
  default) while the service port stays the deployment's;
- NVIDIA Dynamo's DynamoGraphDeployment for a disaggregated deployment (ai-dynamo/dynamo deploy/operator/config/
  crd/bases/nvidia.com_dynamographdeployments.yaml at the 1.3.0 branch cut, v1alpha1): spec.backendFramework, a
  Frontend service (`python3 -m dynamo.frontend --http-port`) and one worker service per pool, each running the
  engine's Dynamo worker in Dynamo's runtime image (extraPodSpec.mainContainer) on resources.limits.gpu GPUs,
  its role as subComponentType (prefill | decode: what Dynamo's planner scales by; in the DGD API since Dynamo
  0.6, as in Dynamo's own examples/backends/vllm/deploy/disagg.yaml);
- KServe's LLMInferenceService (kserve/kserve config/crd/full/llmisvc/serving.kserve.io_llminferenceservices.yaml,
  v1alpha2, the stored version): spec.model, replicas, parallelism, template (the main container: KServe's own
  templates in config/llmisvcconfig start `vllm serve` with the model, its name, the port and the tensor parallel
  size, and append the container's args, which carry the pool's other settings), spec.prefill for the prefill
  side, and the managed router (router.route, gateway, scheduler: empty objects take KServe's). Written for the
  engines those templates start (`RunsUnderKServe`).

Written as YAML without a YAML library (kvbudget's core installs none): block mappings and sequences, every
string double-quoted as JSON quotes it (a JSON string is a YAML double-quoted scalar).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvbudget.engines.scheduling.setup import Role
from kvbudget.errors import KVBudgetError
from kvbudget.gpus import find_gpu
from kvbudget.units import GIB, cdiv

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment, PoolPlan
    from kvbudget.engines.launch import Launch

Launcher = Callable[["PoolPlan", int], "Launch"]  # a pool's command with its engine listening on a port

PROXY_PORT = 8200  # llm-d modelservice values.yaml routing.proxy.targetPort: the decode engine's port behind it
# Kubernetes' extended resource per GPU vendor (the device plugins' names; llm-d values.yaml accelerator.resources)
GPU_RESOURCE = {"NVIDIA": ("nvidia", "nvidia.com/gpu"), "AMD": ("amd", "amd.com/gpu")}


def yaml_text(value: Any, indent: int = 0) -> str:
    """`value` (dicts, lists, strings, numbers, booleans, None) as block-style YAML."""
    return "\n".join(_lines(value, indent)) + "\n"


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
YAML_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "y", "n"}  # YAML 1.1 readers take these as values


def _key(key: str) -> str:
    return key if PLAIN_KEY.fullmatch(key) and key.lower() not in YAML_WORDS else json.dumps(key)


def _lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        out = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{_key(key)}:")
                out += _lines(item, indent + (2 if isinstance(item, dict) else 0))
            else:
                out.append(f"{pad}{_key(key)}: {_lines(item, 0)[0]}")
        return out
    if isinstance(value, list):
        if not value:
            return [pad + "[]"]
        out = []
        for item in value:
            inner = _lines(item, indent + 2)
            out.append(f"{pad}- {inner[0].lstrip()}")
            out += inner[1:]
        return out
    return [pad + _scalar(value)]


def gpu_resource(pool: PoolPlan) -> tuple[str, str]:
    """The accelerator type llm-d names and the Kubernetes resource of the pool's GPU."""
    vendor = find_gpu(pool.gpu).vendor
    if vendor not in GPU_RESOURCE:
        raise KVBudgetError(f"gpu {pool.gpu}: kvbudget writes Kubernetes GPU resources for "
                            f"{', '.join(GPU_RESOURCE)} cards, not {vendor or 'a card of unknown vendor'}", param="gpu")
    return GPU_RESOURCE[vendor]


def _container(launch: Launch, pool: PoolPlan, port: int) -> dict[str, Any]:
    resource = gpu_resource(pool)[1]
    gpus = pool.gpus_per_replica
    return {"name": "main", "image": launch.image, "command": [launch.argv[0]], "args": list(launch.argv[1:]),
            "ports": [{"containerPort": port, "protocol": "TCP"}],
            "resources": {"limits": {resource: gpus}, "requests": {resource: gpus}}}


def resource_name(model: str) -> str:
    """A Kubernetes object name (DNS-1123 label: lowercase letters, digits and '-', at most 63) from a model id."""
    name = re.sub(r"[^a-z0-9]+", "-", model.rsplit("/", 1)[-1].lower()).strip("-")[:63].strip("-")
    return name or "model"


def model_storage(model_bytes: int) -> str:
    """The model volume's size as a Kubernetes quantity: the checkpoint and a tenth more (its tokenizer and
    configuration, and room for a download in progress), in whole GiB."""
    return f"{cdiv(cdiv(model_bytes * 11, 10), GIB)}Gi"


def llmd_values(deployment: Deployment, launch: Launcher, model_bytes: int) -> str:
    """llm-d modelservice values: one decode pool (co-located) or prefill and decode; the model's volume (an
    emptyDir for an hf:// model, whose sizeLimit is modelArtifacts.size: the chart's default is 5Mi) sized for
    `model_bytes`."""
    decode = deployment.pool(Role.DECODE if deployment.disaggregated else Role.BOTH)
    accelerator = gpu_resource(decode)[0]
    name = deployment.served_name or deployment.model
    proxy: dict[str, Any] = {"enabled": deployment.disaggregated, "targetPort": PROXY_PORT}
    if deployment.disaggregated:
        proxy["connector"] = launch(decode, PROXY_PORT).pd_connector
    values: dict[str, Any] = {
        "modelArtifacts": {"name": name, "uri": f"hf://{deployment.model}", "size": model_storage(model_bytes),
                           "labels": {"llm-d.ai/inference-serving": "true"}},
        "accelerator": {"type": accelerator},
        "routing": {"servicePort": deployment.port, "proxy": proxy},
        "decode": _llmd_pool(decode, launch, PROXY_PORT if deployment.disaggregated else deployment.port),
    }
    if deployment.disaggregated:
        values["prefill"] = _llmd_pool(deployment.pool(Role.PREFILL), launch, deployment.port)
    else:
        values["prefill"] = {"create": False}
    head = (f"# llm-d modelservice values for {deployment.model} on {deployment.engine}, written by kvbudget.deploy\n"
            "# helm install NAME llm-d-modelservice/llm-d-modelservice -f llm-d-values.yaml\n")
    return head + yaml_text(values)


def _llmd_pool(pool: PoolPlan, launch: Launcher, port: int) -> dict[str, Any]:
    container = _container(launch(pool, port), pool, port)
    container.update(modelCommand="custom", mountModelVolume=True)
    ranks = {"data": pool.expert_ranks, "dataLocal": pool.expert_ranks} if pool.expert_ranks > 1 else {}
    return {"create": True, "replicas": pool.replicas, "parallelism": {"tensor": pool.tp, **ranks},
            "containers": [container]}


def kserve_service(deployment: Deployment, flags: Callable[[PoolPlan], Launch]) -> str:
    """A KServe LLMInferenceService (v1alpha2): KServe's templates start the engine (the model from spec.model's
    storage, its name, port and tensor parallel size), and each pool's other settings are the main container's
    args, which the templates append (`flags`: a pool's Launch whose argv are those flags)."""
    main = deployment.pool(Role.DECODE if deployment.disaggregated else Role.BOTH)

    def workload(pool: PoolPlan) -> dict[str, Any]:
        resource = gpu_resource(pool)[1]
        gpus = pool.gpus_per_replica
        container = {"name": "main", "args": list(flags(pool).argv),
                     "resources": {"limits": {resource: gpus}, "requests": {resource: gpus}}}
        ranks = {"data": pool.expert_ranks, "dataLocal": pool.expert_ranks, "expert": True} \
            if pool.expert_ranks > 1 else {}
        return {"replicas": pool.replicas, "parallelism": {"tensor": pool.tp, "pipeline": pool.pp, **ranks},
                "template": {"containers": [container]}}

    spec: dict[str, Any] = {"model": {"uri": f"hf://{deployment.model}",
                                      "name": deployment.served_name or deployment.model},
                            **workload(main), "router": {"route": {}, "gateway": {}, "scheduler": {}}}
    if deployment.disaggregated:
        spec["prefill"] = workload(deployment.pool(Role.PREFILL))
    doc = {"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
           "metadata": {"name": resource_name(deployment.served_name or deployment.model)}, "spec": spec}
    return (f"# KServe LLMInferenceService for {deployment.model}, written by kvbudget.deploy\n"
            "# kubectl apply -f kserve-llminferenceservice.yaml\n") + yaml_text(doc)

def dynamo_graph(deployment: Deployment, worker: Callable[[PoolPlan], Launch], framework: str) -> str:
    """A DynamoGraphDeployment: Dynamo's frontend on the deployment's port and a worker service per pool."""
    services: dict[str, Any] = {}
    image = ""
    for pool in deployment.pools:
        launch = worker(pool)
        image = launch.image
        services[f"{pool.role.value.capitalize()}Worker"] = {
            "componentType": "worker", "subComponentType": pool.role.value, "replicas": pool.replicas,
            "resources": {"limits": {"gpu": str(pool.gpus_per_replica)}},
            "extraPodSpec": {"mainContainer": {"name": "main", "image": launch.image, "command": [launch.argv[0]],
                                               "args": list(launch.argv[1:])}}}
    frontend = {"componentType": "frontend", "replicas": 1,
                "extraPodSpec": {"mainContainer": {"name": "main", "image": image, "command": ["python3"],
                                                   "args": ["-m", "dynamo.frontend", "--http-port",
                                                            str(deployment.port)]}}}
    doc = {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
           "metadata": {"name": resource_name(deployment.served_name or deployment.model)},
           "spec": {"backendFramework": framework, "services": {"Frontend": frontend, **services}}}
    return (f"# NVIDIA Dynamo graph for {deployment.model}, prefill and decode disaggregated, written by "
            "kvbudget.deploy\n# kubectl apply -f dynamo-graphdeployment.yaml\n") + yaml_text(doc)
