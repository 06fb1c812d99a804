"""The Kubernetes manifests validated against their projects' own schemas (tests/data/schemas/README.md): llm-d's
modelservice chart values, KServe's LLMInferenceService CRD and Dynamo's DynamoGraphDeployment CRD; the CRDs also as
the API server reads them with kubectl's strict field validation (no field the schema does not declare)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from kvbudget.deploy import files
from kvbudget.deploy.manifests import resource_name, yaml_text
from kvbudget.deployment import Deployment, PoolPlan
from kvbudget.engines.scheduling.setup import Role

SCHEMAS = Path(__file__).resolve().parents[2] / "data" / "schemas"
LLMD = json.loads((SCHEMAS / "llm-d-modelservice.values.schema.json").read_text())
KSERVE = json.loads((SCHEMAS / "kserve-llminferenceservice-v1alpha2.schema.json").read_text())
DYNAMO = json.loads((SCHEMAS / "dynamo-graphdeployment-v1alpha1.schema.json").read_text())
CHECKPOINT = 16_381_470_720  # Qwen3-8B's safetensors (8.19 B parameters in bf16)
MANIFESTS = ("llm-d-values.yaml", "kserve-llminferenceservice.yaml", "dynamo-graphdeployment.yaml")


def undeclared(doc: object, schema: dict, where: str = "") -> list[str]:
    """The fields of `doc` its structural schema does not declare: what the API server prunes, and what `kubectl
    apply` (strict field validation, its default since Kubernetes 1.27) refuses. A schema with properties declares
    those; additionalProperties, every key; x-kubernetes-preserve-unknown-fields, anything below it. The object's
    metadata is Kubernetes' ObjectMeta, which the server checks itself (a CRD's schema says only `type: object`)."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or where == ".metadata":
        return []
    if isinstance(doc, dict):
        if isinstance(schema.get("additionalProperties"), dict):
            return [f for k, v in doc.items() for f in undeclared(v, schema["additionalProperties"], f"{where}.{k}")]
        known = schema.get("properties", {})
        return [f for k, v in doc.items() for f in (undeclared(v, known[k], f"{where}.{k}") if k in known
                                                     else [f"{where}.{k}"])]
    if isinstance(doc, list) and "items" in schema:
        return [f for i, v in enumerate(doc) for f in undeclared(v, schema["items"], f"{where}[{i}]")]
    return []


def pool(role: Role, replicas: int) -> PoolPlan:
    return PoolPlan(role=role, replicas=replicas, gpu="H100-80GB", tp=2, max_num_seqs=64, max_num_batched_tokens=8192,
                    max_model_len=8192, gpu_memory_utilization=0.9)


CO_LOCATED = Deployment(model="Qwen/Qwen3-8B", engine="vllm", pools=(pool(Role.BOTH, 3),), served_name="qwen")
DISAGG = Deployment(model="Qwen/Qwen3-8B", engine="vllm", pools=(pool(Role.PREFILL, 1), pool(Role.DECODE, 2)),
                    kv_link="nvlink")


@pytest.fixture
def written(setups):
    def write(deployment: Deployment) -> dict[str, dict]:
        out = {f.name: f.text for f in files(deployment, setups(deployment), CHECKPOINT)}
        return {name: yaml.safe_load(out[name]) for name in MANIFESTS if name in out}

    return write


@pytest.mark.parametrize("deployment", [CO_LOCATED, DISAGG], ids=["co-located", "disaggregated"])
def test_the_manifests_meet_their_schemas(written, deployment):
    docs = written(deployment)
    jsonschema.Draft7Validator(LLMD).validate(docs["llm-d-values.yaml"])
    jsonschema.Draft7Validator(KSERVE).validate(docs["kserve-llminferenceservice.yaml"])
    assert undeclared(docs["kserve-llminferenceservice.yaml"], KSERVE) == []
    if deployment.disaggregated:
        jsonschema.Draft7Validator(DYNAMO).validate(docs["dynamo-graphdeployment.yaml"])
        assert undeclared(docs["dynamo-graphdeployment.yaml"], DYNAMO) == []
    else:
        assert "dynamo-graphdeployment.yaml" not in docs  # Dynamo's graph is written for disaggregated choices


def test_the_schemas_catch_a_wrong_manifest(written):
    docs = written(CO_LOCATED)
    docs["llm-d-values.yaml"]["decode"]["replicas"] = "three"
    docs["kserve-llminferenceservice.yaml"]["spec"]["parallelism"]["tensor"] = 0  # minimum 1
    assert not jsonschema.Draft7Validator(LLMD).is_valid(docs["llm-d-values.yaml"])
    assert not jsonschema.Draft7Validator(KSERVE).is_valid(docs["kserve-llminferenceservice.yaml"])


def test_llmd_runs_each_pool_with_its_own_command_behind_the_sidecar(written):
    values = written(DISAGG)["llm-d-values.yaml"]
    assert values["routing"]["proxy"]["enabled"] is True and values["routing"]["servicePort"] == 8000
    # llm-d-inference-scheduler pkg/sidecar/proxy: the nixlv2 connector pairs with vLLM's NixlConnector
    assert values["routing"]["proxy"]["connector"] == "nixlv2"
    decode, prefill = values["decode"], values["prefill"]
    assert (decode["replicas"], prefill["replicas"]) == (2, 1)
    main = decode["containers"][0]
    assert main["modelCommand"] == "custom" and main["command"] == ["vllm"]
    # the decode engine listens on the sidecar's targetPort (the chart's 8200), prefill on the service port
    assert main["args"][main["args"].index("--port") + 1] == "8200" == str(values["routing"]["proxy"]["targetPort"])
    pargs = prefill["containers"][0]["args"]
    assert pargs[pargs.index("--port") + 1] == "8000" and "--kv-transfer-config" in pargs
    assert main["resources"]["limits"] == {"nvidia.com/gpu": 2}
    # the chart's model volume for hf:// is an emptyDir of sizeLimit modelArtifacts.size (default 5Mi): 16.4 GB
    # (15.26 GiB) and a tenth more is 16.78 GiB, 17Gi in whole GiB
    assert values["modelArtifacts"]["size"] == "17Gi"
    co = written(CO_LOCATED)["llm-d-values.yaml"]
    assert co["prefill"] == {"create": False} and co["routing"]["proxy"]["enabled"] is False


def test_kserve_takes_the_decode_pool_as_its_main_workload_and_prefill_apart(written):
    doc = written(DISAGG)["kserve-llminferenceservice.yaml"]
    assert doc["apiVersion"] == "serving.kserve.io/v1alpha2" and doc["kind"] == "LLMInferenceService"
    assert doc["metadata"]["name"] == "qwen3-8b" and doc["spec"]["model"]["uri"] == "hf://Qwen/Qwen3-8B"
    assert doc["spec"]["replicas"] == 2 and doc["spec"]["prefill"]["replicas"] == 1
    assert doc["spec"]["parallelism"] == {"tensor": 2, "pipeline": 1}
    # KServe's templates (config/llmisvcconfig) run `vllm serve /mnt/models --served-model-name ... --port ...
    # --tensor-parallel-size ... $@`: the container keeps their command and image and passes the rest as args
    main = doc["spec"]["template"]["containers"][0]
    assert "command" not in main and "image" not in main and main["name"] == "main"
    args = main["args"]
    assert not {"--port", "--served-model-name", "--tensor-parallel-size", "Qwen/Qwen3-8B", "vllm"} & set(args)
    assert args[args.index("--max-num-seqs") + 1] == "64" and "--kv-transfer-config" in args


def test_kserve_is_written_only_for_the_engine_its_templates_start(setups):
    p = PoolPlan(gpu="H100-80GB", max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=8192,
                 gpu_memory_utilization=0.85)
    d = Deployment(model="Qwen/Qwen3-8B", engine="sglang", pools=(p,))
    out = {f.name: f.text for f in files(d, setups(d), CHECKPOINT)}
    assert "kserve-llminferenceservice.yaml" not in out
    assert "no LLMInferenceService: KServe's templates start vllm only" in out["README.md"]
    jsonschema.Draft7Validator(LLMD).validate(yaml.safe_load(out["llm-d-values.yaml"]))


def test_the_yaml_writer_reads_back_as_written():
    value = {"a": [1, 2.5, {"b": None, "c": [], "d": {}}], "yes": "no", "e f": 'quote " and\nnewline', "t": True,
             "u": "ünï", "n": "0123"}
    assert yaml.safe_load(yaml_text(value)) == value


def test_resource_names_are_dns_labels():
    assert resource_name("meta-llama/Llama-3.1-8B-Instruct") == "llama-3-1-8b-instruct"
    assert resource_name("org/" + "x" * 80) == "x" * 63
    assert resource_name("___") == "model"


def test_the_dynamo_schema_catches_a_wrong_graph(written):
    doc = written(DISAGG)["dynamo-graphdeployment.yaml"]
    for path, value in ((("spec", "backendFramework"), "tgi"), (("spec", "services", "DecodeWorker", "replicas"), "2"),
                        (("spec", "services", "DecodeWorker", "resources", "limits", "gpu"), 2),
                        (("spec", "services", "DecodeWorker", "gpus"), 2),
                        (("spec", "services", "Frontend", "extraPodSpec", "mainContainer", "argv"), ["x"])):
        broken = json.loads(json.dumps(doc))
        where = broken
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
        assert not jsonschema.Draft7Validator(DYNAMO).is_valid(broken) or undeclared(broken, DYNAMO), path
    assert undeclared(doc | {"spec": doc["spec"] | {"graph": {}}}, DYNAMO) == [".spec.graph"]


def test_dynamo_runs_the_engines_worker_in_its_runtime_for_each_side(written):
    spec = written(DISAGG)["dynamo-graphdeployment.yaml"]["spec"]
    assert spec["backendFramework"] == "vllm" and set(spec["services"]) == {"Frontend", "PrefillWorker",
                                                                            "DecodeWorker"}
    front = spec["services"]["Frontend"]["extraPodSpec"]["mainContainer"]
    assert front["args"] == ["-m", "dynamo.frontend", "--http-port", "8000"]
    for side, replicas in (("Prefill", 1), ("Decode", 2)):
        service = spec["services"][f"{side}Worker"]
        assert service["replicas"] == replicas and service["resources"]["limits"]["gpu"] == "2"
        # the role as Dynamo's planner reads it (the DGD's subComponentType, Dynamo 0.6 and later; its
        # examples/backends/vllm/deploy/disagg.yaml at the 1.3.0 branch cut)
        assert service["componentType"] == "worker" and service["subComponentType"] == side.lower()
        main = service["extraPodSpec"]["mainContainer"]
        assert main["command"] == ["python3"] and main["args"][:4] == ["-m", "dynamo.vllm", "--model", "Qwen/Qwen3-8B"]
        # Dynamo 1.0 and later: the worker's role as --disaggregation-mode (aiconfigurator's vllm_worker_role_args)
        assert main["args"][main["args"].index("--disaggregation-mode") + 1] == side.lower()
        assert "--port" not in main["args"]  # Dynamo's frontend serves HTTP, not the worker
        assert main["image"].startswith("nvcr.io/nvidia/ai-dynamo/vllm-runtime:")


def test_an_amd_card_asks_for_amds_device_resource(written):
    # llm-d values.yaml accelerator.resources: amd -> amd.com/gpu (AMD's device plugin)
    p = PoolPlan(gpu="MI300X", tp=1, max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=8192,
                 gpu_memory_utilization=0.9)
    docs = written(Deployment(model="Qwen/Qwen3-8B", engine="vllm", pools=(p,)))
    values = docs["llm-d-values.yaml"]
    assert values["accelerator"]["type"] == "amd"
    assert values["decode"]["containers"][0]["resources"]["limits"] == {"amd.com/gpu": 1}
    jsonschema.Draft7Validator(LLMD).validate(values)
    jsonschema.Draft7Validator(KSERVE).validate(docs["kserve-llminferenceservice.yaml"])


EXPERT = Deployment(model="Qwen/Qwen3-30B-A3B", engine="vllm", pools=(
    PoolPlan(gpu="H100-80GB", tp=1, max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192,
             gpu_memory_utilization=0.9, expert_ranks=4),))


def test_an_expert_parallel_group_is_one_server_on_all_its_ranks_gpus(written):
    """vLLM --data-parallel-size 4 --enable-expert-parallel: one server (one pod) holding the four ranks' GPUs; the
    manifests say so in their own fields and still meet their schemas."""
    docs = written(EXPERT)
    llmd, kserve = docs["llm-d-values.yaml"], docs["kserve-llminferenceservice.yaml"]
    jsonschema.Draft7Validator(LLMD).validate(llmd)
    jsonschema.Draft7Validator(KSERVE).validate(kserve)
    assert undeclared(kserve, KSERVE) == []
    container = llmd["decode"]["containers"][0]
    assert llmd["decode"]["replicas"] == 1 and llmd["decode"]["parallelism"] == {"tensor": 1, "data": 4,
                                                                                 "dataLocal": 4}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 4}
    args = container["args"]
    assert args[args.index("--data-parallel-size") + 1] == "4" and "--enable-expert-parallel" in args
    assert kserve["spec"]["parallelism"] == {"tensor": 1, "pipeline": 1, "data": 4, "dataLocal": 4, "expert": True}
    assert kserve["spec"]["template"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert EXPERT.pools[0].gpus == 4
