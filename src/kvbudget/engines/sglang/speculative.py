"""What a drafter costs SGLang in memory, from SGLang 0.5.3's source (python/sglang/srt in the sdist; not run here:
labelled as from source in every answer).

- Methods (server_args.py `--speculative-algorithm`): EAGLE, EAGLE3, NEXTN (a model's own MTP layers, run as EAGLE),
  STANDALONE (a separate draft model) and NGRAM (CUDA only). kvbudget's draft tokens per step K are
  `--speculative-num-steps` at `--speculative-eagle-topk 1`, where SGLang sets `--speculative-num-draft-tokens` to
  K + 1 (`_handle_speculative_decoding`).
- max_running_requests defaults to 48 with any of them (the same function).
- The default mem_fraction_static leaves 2 GiB more aside for EAGLE heads (and MTP) and their CUDA graphs, 6 GiB more
  for a STANDALONE draft model, none for NGRAM (server_args.py `_handle_gpu_memory_settings`).
- The pool (model_executor/model_runner.py `init_memory_pool`): the target profiles its tokens from its own cell size
  as without a drafter; with EAGLE, NEXTN or STANDALONE it then adds headroom, max_num_reqs x (num_steps x topk +
  num_draft_tokens) + 100 tokens, and the draft worker allocates a pool of that many tokens at its own cell size (its
  layers; NEXTN: num_nextn_predict_layers), sized apart from mem_fraction_static: the draft's pool and weights come
  out of the memory SGLang leaves aside. NGRAM adds no pool.
"""

from __future__ import annotations

from kvbudget.speculative import SpecMethod, Speculative

READ = (0, 5, 3)  # the release whose source was read
METHODS = (SpecMethod.EAGLE, SpecMethod.EAGLE3, SpecMethod.MTP, SpecMethod.DRAFT_MODEL, SpecMethod.NGRAM)
NAMES = {SpecMethod.EAGLE: "EAGLE", SpecMethod.EAGLE3: "EAGLE3", SpecMethod.MTP: "NEXTN",
         SpecMethod.DRAFT_MODEL: "STANDALONE", SpecMethod.NGRAM: "NGRAM"}
MAX_RUNNING_REQUESTS = 48  # server_args.py: the default with speculative decoding
POOL_BUFFER = 100  # model_runner.py: tokens added to the shared pool's headroom


def methods(release: tuple[int, ...]) -> tuple[SpecMethod, ...]:
    return METHODS if tuple(release) == READ else ()


def reserve_mib(spec: Speculative | None) -> int:
    """MiB the default mem_fraction_static leaves aside beyond its rule for the drafter and its CUDA graphs."""
    if spec is None or spec.method is SpecMethod.NGRAM:
        return 0
    return 6 * 1024 if spec.method is SpecMethod.DRAFT_MODEL else 2 * 1024


def headroom(spec: Speculative | None) -> int:
    """Tokens the shared pool adds for draft and verified tokens: 48 x (K x 1 + K + 1) + 100; none for NGRAM."""
    if spec is None or spec.method is SpecMethod.NGRAM:
        return 0
    return MAX_RUNNING_REQUESTS * (spec.num_tokens + spec.num_tokens + 1) + POOL_BUFFER
