"""`llama-server` for one pool of a deployment: the flags of common/arg.cpp in the llama.cpp that llama-cpp-python
0.3.36 vendors (the build tests/engines run; `llama-server --help` lists the same), the newest kvbudget models.

- `-hf REPO` loads the model from the Hugging Face Hub (a GGUF repository; `-m FILE` for a local file);
- `-np N` slots (max_num_seqs) and `-c N x max_model_len`: without --kv-unified each slot gets its own stream of
  n_ctx / N cells (engine.py), so every slot holds max_model_len tokens;
- `-b` the logical batch (max_num_batched_tokens); `-ngl all` every layer on the GPU;
- `-ctk` / `-ctv` the cache type of K and V (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, as that
  build's `llama-server --help` lists them);
- `--no-cache-prompt` turns prompt caching off; `--cache-ram MiB` the host-RAM prompt cache (offload);
- `--metrics` publishes /metrics (off by default); `--host 0.0.0.0` (its default is 127.0.0.1, unreachable from
  outside a container).
- speculative decoding (the methods kvbudget sizes at this build: engine.py speculative_methods): a draft model,
  `-hfd REPO` (`--model-draft FILE` for a .gguf) with `--spec-type draft-simple` and `--spec-draft-n-max K`
  (common_speculative_impl_draft_simple drafts up to params.draft.n_max, common/speculative.cpp); n-gram lookup,
  `--spec-type ngram-simple` with `--spec-ngram-simple-size-m K` (ngram-simple drafts up to size_m tokens).
llama-server takes no memory fraction, no tensor or pipeline parallelism as kvbudget models them, no queue limits
and no disaggregated prefill: those are refused or left to the guard, and said so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbudget.engines.launch import Launch, refuse
from kvbudget.engines.scheduling.setup import Role
from kvbudget.speculative import SpecMethod

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment, PoolPlan

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")  # common/arg.cpp kv_cache_types
# the flags of common/arg.cpp (llama-cpp-python 0.3.36's llama.cpp) this module writes
FLAGS = ("-hf", "--host", "--port", "--alias", "-np", "-c", "-b", "-ngl", "-ctk", "-ctv", "--no-cache-prompt",
         "--cache-ram", "--metrics", "-hfd", "--model-draft", "--spec-type", "--spec-draft-n-max",
         "--spec-ngram-simple-size-m")
MIB = 2**20


def command(pool: PoolPlan, deployment: Deployment) -> Launch:
    if deployment.release:
        raise refuse("release", f"llama.cpp {deployment.release}: kvbudget writes llama-server's flags of the build "
                                "it runs in its tests (llama-cpp-python 0.3.36's); leave the release out")
    if pool.role is not Role.BOTH:
        raise refuse("kv_link", "llama-server does not disaggregate prefill and decode; give one co-located pool")
    for value, param in ((pool.tp, "tp"), (pool.pp, "pp")):
        if value > 1:
            raise refuse(param, "llama-server splits layers over a server's GPUs (--split-mode), not as tensor or "
                                "pipeline parallelism; give 1")
    kv = "f16" if pool.kv_dtype == "auto" else pool.kv_dtype
    if kv not in CACHE_TYPES:
        raise refuse("kv_dtype", f"{pool.kv_dtype!r}: llama-server's -ctk/-ctv take {', '.join(CACHE_TYPES)}")
    argv = ["llama-server", "-hf", deployment.model, "--host", "0.0.0.0", "--port", str(deployment.port)]
    if deployment.served_name:
        argv += ["--alias", deployment.served_name]
    argv += ["-np", str(pool.max_num_seqs), "-c", str(pool.max_num_seqs * pool.max_model_len),
             "-b", str(pool.max_num_batched_tokens), "-ngl", "all", "-ctk", kv, "-ctv", kv]
    if not pool.prefix_caching:
        argv.append("--no-cache-prompt")
    if pool.offload_bytes is not None:
        if pool.offload_bytes < MIB:
            raise refuse("offload_bytes", "llama-server's prompt cache (--cache-ram) is whole MiB; give at least 1 MiB")
        argv += ["--cache-ram", str(pool.offload_bytes // MIB)]
    argv.append("--metrics")
    spec = pool.speculative
    if spec is not None and spec.method is SpecMethod.DRAFT_MODEL and spec.draft_id is not None:
        argv += ["--model-draft" if spec.draft_id.endswith(".gguf") else "-hfd", spec.draft_id,
                 "--spec-type", "draft-simple", "--spec-draft-n-max", str(spec.num_tokens)]
    elif spec is not None and spec.method is SpecMethod.NGRAM:
        argv += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", str(spec.num_tokens)]
    elif spec is not None:
        raise refuse("speculative", f"{spec.method}: kvbudget writes llama-server's draft-model and ngram drafting "
                                    "(the methods it sizes at this build); give one of them")
    notes = [f"llama-server takes no memory fraction: it allocates what -c and -np need at start "
             f"(gpu_memory_utilization {pool.gpu_memory_utilization} not written)"]
    if pool.max_num_queued_reqs is not None or pool.max_num_queued_tokens is not None:
        notes.append("llama-server has no queue limits: the guard's reject level stands in for them")
    if pool.block_size is not None:
        notes.append(f"llama-server keeps KV in cells, not blocks: block_size {pool.block_size} not written")
    return Launch(argv=tuple(argv), image="ghcr.io/ggml-org/llama.cpp:server-cuda", notes=tuple(notes),
                  source="llama.cpp: flags as in common/arg.cpp of llama-cpp-python 0.3.36's copy")
