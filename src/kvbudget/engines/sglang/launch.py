"""`python -m sglang.launch_server` for one pool of a deployment, per release (the flags: python/sglang/srt/
server_args.py ServerArgs.add_cli_args of the 0.4.6 and 0.5.3 wheels on PyPI; FLAGS below lists, per era, those
this module writes, each present in that release's file):

- --model-path, --port, --served-model-name, --tp-size, --max-running-requests (max_num_seqs),
  --chunked-prefill-size (max_num_batched_tokens), --context-length, --mem-fraction-static (the memory fraction),
  --kv-cache-dtype (choices auto, fp8_e5m2, fp8_e4m3 in both), --page-size, --disable-radix-cache (prefix caching
  off), --enable-metrics (its /metrics, which the guard and the alerts read, is off unless asked): both eras;
- --pp-size: 0.5.3 (0.4.6 has no pipeline parallelism);
- --enable-hierarchical-cache --hicache-size GB (an integer per rank, in 10^9 bytes: hicache.py): 0.5.3, as the
  host tier is modelled (hicache.py);
- --max-queued-requests (max_num_queued_reqs; "ignored when using disaggregation-mode"): 0.5.3; SGLang has no
  limit on queued tokens;
- --disaggregation-mode prefill|decode with --disaggregation-transfer-backend nixl (choices mooncake, nixl in
  0.4.6; mooncake, nixl, ascend, fake in 0.5.3).
- speculative decoding, 0.5.3 (the release whose drafters kvbudget sizes: engines/sglang/speculative.py):
  --speculative-algorithm EAGLE|EAGLE3|NEXTN|STANDALONE|NGRAM, --speculative-num-steps K --speculative-eagle-topk 1
  --speculative-num-draft-tokens K + 1 (the chain kvbudget sizes and simulates), --speculative-draft-model-path
  (NEXTN takes the target's own path: _handle_speculative_decoding); NGRAM drafts K + 1 tokens a request
  (ngram_worker.py draft_token_num, the last token among them) in a tree of --speculative-ngram-max-bfs-breadth
  branches, written 1 for the chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbudget.engines.launch import Launch, refuse
from kvbudget.engines.scheduling.setup import Role
from kvbudget.engines.sglang import speculative
from kvbudget.engines.sglang.releases import NEWEST, release_name

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment, PoolPlan
    from kvbudget.engines.sglang.engine import SGLangEngine
    from kvbudget.speculative import Speculative

KV_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3")  # --kv-cache-dtype's choices in 0.4.6 and 0.5.3
OLDEST = (0, 4, 6)  # the oldest release whose server_args.py was read
LATER = (0, 5, 3)  # --pp-size, --hicache-size as modelled, --max-queued-requests
# the flags each era's server_args.py defines that this module writes (tests check every one written is here)
FLAGS = {
    (0, 4, 6): ("--model-path", "--port", "--served-model-name", "--tp-size", "--max-running-requests",
                "--chunked-prefill-size", "--context-length", "--mem-fraction-static", "--kv-cache-dtype",
                "--page-size", "--disable-radix-cache", "--enable-metrics", "--disaggregation-mode",
                "--disaggregation-transfer-backend", "--enable-hierarchical-cache", "--hicache-size"),
    (0, 5, 3): ("--model-path", "--port", "--served-model-name", "--tp-size", "--pp-size", "--max-running-requests",
                "--chunked-prefill-size", "--context-length", "--mem-fraction-static", "--kv-cache-dtype",
                "--page-size", "--disable-radix-cache", "--enable-metrics", "--disaggregation-mode",
                "--disaggregation-transfer-backend", "--enable-hierarchical-cache", "--hicache-size",
                "--max-queued-requests", "--speculative-algorithm", "--speculative-num-steps",
                "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--speculative-draft-model-path",
                "--speculative-ngram-max-bfs-breadth"),
}


def command(engine: SGLangEngine, pool: PoolPlan, deployment: Deployment) -> Launch:
    version = tuple(engine.parse_release(deployment.release)) if deployment.release else NEWEST
    shown = release_name(version)
    if version < OLDEST or OLDEST < version < LATER:  # 0.4.8-0.5.2's flags were not read
        raise refuse("release", f"SGLang {shown}: kvbudget writes launch_server's flags as read in 0.4.6 and 0.5.3 "
                                "(0.5.4-0.5.10 taken as 0.5.3); give 0.4.6 or 0.5")
    if pool.kv_dtype not in KV_DTYPES:
        raise refuse("kv_dtype", f"{pool.kv_dtype!r}: SGLang {shown}'s --kv-cache-dtype takes {', '.join(KV_DTYPES)}")
    later = version >= LATER
    if pool.pp > 1 and not later:
        raise refuse("pp", f"SGLang {shown} has no pipeline parallelism (--pp-size from 0.5); give pp 1")
    argv = ["python", "-m", "sglang.launch_server", "--model-path", deployment.model, "--port", str(deployment.port)]
    if deployment.served_name:
        argv += ["--served-model-name", deployment.served_name]
    argv += ["--tp-size", str(pool.tp)] + (["--pp-size", str(pool.pp)] if later else [])
    argv += ["--max-running-requests", str(pool.max_num_seqs), "--chunked-prefill-size",
             str(pool.max_num_batched_tokens), "--context-length", str(pool.max_model_len), "--mem-fraction-static",
             repr(pool.gpu_memory_utilization), "--kv-cache-dtype", pool.kv_dtype]
    if pool.block_size is not None:
        argv += ["--page-size", str(pool.block_size)]
    if not pool.prefix_caching:
        argv.append("--disable-radix-cache")
    argv.append("--enable-metrics")
    if pool.offload_bytes is not None:
        gb = pool.offload_bytes // pool.tp // 10**9
        if not later or gb < 1:
            raise refuse("offload_bytes", f"SGLang's host tier is written from 0.5.3 in whole GB per rank "
                                          f"(--hicache-size); {pool.offload_bytes:,} bytes over {pool.tp} rank(s) "
                                          f"on {shown} cannot be")
        argv += ["--enable-hierarchical-cache", "--hicache-size", str(gb)]
    if pool.speculative is not None:
        argv += speculative_args(pool.speculative, version, shown)
    notes = []
    if pool.role is not Role.BOTH:
        argv += ["--disaggregation-mode", pool.role.value, "--disaggregation-transfer-backend", "nixl"]
    if pool.max_num_queued_reqs is not None and later and pool.role is Role.BOTH:
        argv += ["--max-queued-requests", str(pool.max_num_queued_reqs)]
    elif pool.max_num_queued_reqs is not None:
        why = ("has no --max-queued-requests (from 0.5.3)" if not later
               else "ignores --max-queued-requests under disaggregation (server_args.py)")
        notes.append(f"SGLang {shown} {why}: the guard's reject level stands in for it")
    if pool.max_num_queued_tokens is not None:
        notes.append("SGLang has no limit on queued prompt tokens: the guard's reject level stands in for it")
    read = release_name(LATER if later else OLDEST)
    return Launch(argv=tuple(argv), image=f"lmsysorg/sglang:v{shown}", notes=tuple(notes),
                  pd_connector="sglang" if pool.role is not Role.BOTH else "",
                  source=f"SGLang {shown}: flags as in python/sglang/srt/server_args.py of the {read} wheel")


def speculative_args(spec: Speculative, version: tuple[int, ...], shown: str) -> list[str]:
    """The speculative decoding flags of `spec` on `version` (refused where kvbudget does not size the method)."""
    from kvbudget.speculative import SpecMethod

    if spec.method not in speculative.methods(version):
        takes = ", ".join(speculative.METHODS)
        raise refuse("speculative", f"{spec.method}: kvbudget writes SGLang's speculative flags as read in "
                                    f"{release_name(speculative.READ)}'s server_args.py ({takes}), not {shown}; "
                                    f"give {release_name(speculative.READ)}")
    argv = ["--speculative-algorithm", speculative.NAMES[spec.method]]
    if spec.method is SpecMethod.NGRAM:
        return [*argv, "--speculative-num-draft-tokens", str(spec.num_tokens + 1),
                "--speculative-ngram-max-bfs-breadth", "1"]
    argv += ["--speculative-num-steps", str(spec.num_tokens), "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", str(spec.num_tokens + 1)]
    return argv + (["--speculative-draft-model-path", spec.draft_id] if spec.draft_id is not None else [])
