"""Each engine's command line for a deployment's pool (`Launches`): the flags written from the engines' own
documentation and source, per release, and every flag written checked against the flags the release defines."""

from __future__ import annotations

import json
import shlex

import pytest

from kvbudget.deployment import Deployment, PoolPlan
from kvbudget.engines import get_engine
from kvbudget.engines.launch import Launches
from kvbudget.engines.llamacpp.launch import FLAGS as LLAMA_FLAGS
from kvbudget.engines.scheduling.setup import Role
from kvbudget.engines.sglang.launch import FLAGS as SGLANG_FLAGS
from kvbudget.engines.vllm.launch import flag_data
from kvbudget.errors import KVBudgetError

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def pool(**changes) -> PoolPlan:
    settings = dict(gpu="H100-80GB", tp=2, max_num_seqs=128, max_num_batched_tokens=4096, max_model_len=16384,
                    gpu_memory_utilization=0.85, max_num_queued_reqs=300, max_num_queued_tokens=50000)
    settings.update(changes)
    return PoolPlan(**settings)


def command(engine: str, p: PoolPlan, release: str | None = None, **kw) -> tuple[str, ...]:
    disagg = p.role is not Role.BOTH
    pools = (p, PoolPlan(**{**p.__dict__, "role": Role.PREFILL if p.role is Role.DECODE else Role.DECODE})) \
        if disagg else (p,)
    deployment = Deployment(model=MODEL, engine=engine, release=release, pools=pools,
                            kv_link="nvlink" if disagg else None, **kw)
    return get_engine(engine).command(p, deployment).argv


def test_vllm_032_serve_as_its_docs_spell_it():
    # vLLM's engine arguments page and `vllm serve --help` (0.32): each setting its own flag, prefix caching turned
    # off by its BooleanOptionalAction's --no- form, the offload size in GiB, the queue limits from 0.29
    argv = command("vllm", pool(prefix_caching=False, offload_bytes=48 * 2**30, kv_dtype="fp8", block_size=32),
                   served_name="chat")
    assert argv == ("vllm", "serve", MODEL, "--served-model-name", "chat", "--port", "8000",
                    "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1", "--max-num-seqs", "128",
                    "--max-num-batched-tokens", "4096", "--max-model-len", "16384", "--gpu-memory-utilization", "0.85",
                    "--kv-cache-dtype", "fp8", "--block-size", "32", "--no-enable-prefix-caching",
                    "--kv-offloading-size", "48.0", "--kv-offloading-backend", "native",
                    "--max-num-queued-reqs", "300", "--max-num-queued-tokens", "50000")


def test_vllm_disaggregated_pools_take_the_nixl_connector_on_both_sides():
    for role in (Role.PREFILL, Role.DECODE):
        argv = command("vllm", pool(role=role))
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def test_vllm_before_029_has_no_queue_limits_and_says_so():
    p = pool()
    deployment = Deployment(model=MODEL, engine="vllm", release="0.28.0", pools=(p,))
    launch = get_engine("vllm").command(p, deployment)
    assert "--max-num-queued-reqs" not in launch.argv and "--max-num-queued-tokens" not in launch.argv
    assert len(launch.notes) == 2 and all("0.29" in n for n in launch.notes)


@pytest.mark.parametrize(("release", "param"), [("0.11.0", "offload_bytes"), ("0.8.5", "kv_dtype"),
                                                ("0.8.5", "kv_link"), ("0.7.3", "release")])
def test_vllm_settings_a_release_cannot_take_are_one_line_errors(release, param):
    # no --kv-offloading-size before 0.12; CacheDType without bfloat16 before 0.11; no NixlConnector before 0.9;
    # no flags read before 0.8.5
    p = pool(offload_bytes=2**30 if param == "offload_bytes" else None,
             kv_dtype="bfloat16" if param == "kv_dtype" else "auto",
             role=Role.DECODE if param == "kv_link" else Role.BOTH)
    with pytest.raises(KVBudgetError) as exc:
        command("vllm", p, release)
    assert exc.value.param == param and "\n" not in str(exc.value)


@pytest.mark.parametrize("release", sorted(flag_data()["releases"]))
def test_every_vllm_flag_written_is_one_the_release_defines(release):
    """Each release's flags as scripts/vllm_flags.py read them from its arg_utils.py and cli_args.py."""
    data = flag_data()["releases"][release]
    version = tuple(map(int, release.split(".")))
    p = pool(prefix_caching=False, offload_bytes=2**30 if version >= (0, 12) else None)
    for role in (Role.BOTH, Role.DECODE) if version >= (0, 9) else (Role.BOTH,):
        argv = command("vllm", PoolPlan(**{**p.__dict__, "role": role}), release, served_name="x")
        flags = [a for a in argv if a.startswith("--")]
        negated = {"--no-" + f[2:] for f in data["negatable"]}
        assert [f for f in flags if f not in data["flags"] and f not in negated] == []


def test_vllm_flag_data_holds_what_the_release_notes_say():
    # --kv-offloading-size arrived in 0.12, --max-num-queued-reqs/-tokens in 0.29, --kv-transfer-config by 0.8.5
    releases = flag_data()["releases"]
    assert "--kv-offloading-size" not in releases["0.11.0"]["flags"]
    assert "--kv-offloading-size" in releases["0.12.0"]["flags"]
    assert "--max-num-queued-reqs" not in releases["0.28.0"]["flags"]
    assert {"--max-num-queued-reqs", "--max-num-queued-tokens"} <= set(releases["0.32.0"]["flags"])
    assert all("--kv-transfer-config" in r["flags"] and "--port" in r["flags"] for r in releases.values())


def test_sglang_053_launch_server_as_its_server_args_spell_it():
    argv = command("sglang", pool(prefix_caching=False, offload_bytes=40 * 10**9, kv_dtype="fp8_e4m3", block_size=16))
    assert argv == ("python", "-m", "sglang.launch_server", "--model-path", MODEL, "--port", "8000",
                    "--tp-size", "2", "--pp-size", "1", "--max-running-requests", "128",
                    "--chunked-prefill-size", "4096", "--context-length", "16384", "--mem-fraction-static", "0.85",
                    "--kv-cache-dtype", "fp8_e4m3", "--page-size", "16", "--disable-radix-cache", "--enable-metrics",
                    "--enable-hierarchical-cache", "--hicache-size", "20", "--max-queued-requests", "300")


def test_sglang_disaggregated_and_old_releases():
    argv = command("sglang", pool(role=Role.PREFILL))
    assert argv[argv.index("--disaggregation-mode") + 1] == "prefill"
    assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "nixl"
    assert "--max-queued-requests" not in argv  # "ignored when using disaggregation-mode"
    p = pool(role=Role.DECODE)
    deployment = Deployment(model=MODEL, engine="sglang", pools=(p, pool(role=Role.PREFILL)), kv_link="nvlink")
    assert get_engine("sglang").command(p, deployment).pd_connector == "sglang"  # llm-d's sidecar connector
    with pytest.raises(KVBudgetError) as exc:
        command("sglang", pool(pp=2), "0.4.6")
    assert exc.value.param == "pp"
    for release in ("0.4.6", "0.5.3"):
        version = tuple(map(int, release.split(".")))
        for p in (pool(), pool(role=Role.DECODE, prefix_caching=False)):
            written = [a for a in command("sglang", p, release, served_name="x") if a.startswith("--")]
            assert [f for f in written if f not in SGLANG_FLAGS[version]] == []


def test_llama_server_as_its_help_spells_it():
    argv = command("llamacpp", pool(tp=1, kv_dtype="q8_0", offload_bytes=4 * 2**30, max_num_seqs=4,
                                    max_model_len=8192, max_num_batched_tokens=2048))
    # llama-server --help: -np slots, -c the whole context (each slot n_ctx / np), -ctk/-ctv, --cache-ram MiB
    assert argv == ("llama-server", "-hf", MODEL, "--host", "0.0.0.0", "--port", "8000", "-np", "4", "-c", "32768",
                    "-b", "2048", "-ngl", "all", "-ctk", "q8_0", "-ctv", "q8_0", "--cache-ram", "4096", "--metrics")
    assert [a for a in argv if a.startswith("-") and a not in LLAMA_FLAGS] == []
    for changes, param in (({"tp": 2}, "tp"), ({"tp": 1, "role": Role.DECODE}, "kv_link"),
                           ({"tp": 1, "kv_dtype": "fp8"}, "kv_dtype")):
        with pytest.raises(KVBudgetError) as exc:
            command("llamacpp", pool(**changes))
        assert exc.value.param == param


def test_the_shell_line_quotes_the_json():
    p = pool(role=Role.DECODE)
    deployment = Deployment(model=MODEL, engine="vllm", pools=(p, pool(role=Role.PREFILL)), kv_link="nvlink")
    launch = get_engine("vllm").command(p, deployment)
    assert tuple(shlex.split(launch.shell)) == launch.argv


def test_engines_without_a_command_line_do_not_claim_one():
    assert isinstance(get_engine("vllm"), Launches) and isinstance(get_engine("sglang"), Launches)
    assert not isinstance(get_engine("tgi"), Launches) and not isinstance(get_engine("hf"), Launches)


@pytest.mark.parametrize(("planned", "image", "role_args", "bundled_note"), [
    (None, "1.3.0", ["--disaggregation-mode", "prefill"], True),  # 0.32 planned; Dynamo 1.3.0 bundles 0.24.0
    ("0.16.0", "1.0.0", ["--disaggregation-mode", "prefill"], False),
    ("0.14.1", "0.9.0", ["--is-prefill-worker"], False),  # before Dynamo 1.0: the legacy role flag
])
def test_dynamo_runs_the_vllm_its_runtime_bundles(planned, image, role_args, bundled_note):
    # aiconfigurator's backend_version_matrix.yaml: Dynamo 1.3.0 ships vLLM 0.24.0, 1.0.0 ships 0.16.0, 0.9.0 0.14.1
    p = pool(role=Role.PREFILL)
    deployment = Deployment(model=MODEL, engine="vllm", release=planned, kv_link="nvlink",
                            pools=(p, PoolPlan(**{**p.__dict__, "role": Role.DECODE})))
    launch = get_engine("vllm").dynamo_worker(p, deployment)
    assert launch.argv[:5] == ("python3", "-m", "dynamo.vllm", "--model", MODEL)
    assert list(launch.argv[-len(role_args):]) == role_args and "--port" not in launch.argv
    assert launch.image == f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{image}"
    assert any("bundles vLLM" in n for n in launch.notes) == bundled_note
    with pytest.raises(KVBudgetError) as exc:
        get_engine("vllm").dynamo_worker(p, Deployment(**{**deployment.__dict__, "release": "0.10.2"}))
    assert exc.value.param == "release"
