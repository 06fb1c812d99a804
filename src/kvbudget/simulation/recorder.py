"""A vLLM scheduler that writes down what the real one decides: for the simulator's exactness tests, and for
`kvbudget simulate --calibrate` (measured step times on your own hardware).

Run vLLM with kvbudget importable (installed in vLLM's environment, or on PYTHONPATH) and
    KVBUDGET_SCHEDULE_LOG=steps.jsonl vllm serve MODEL --scheduler-cls kvbudget.simulation.recorder.RecordingScheduler
It appends one JSON line per event: each request added (its prompt token ids and max_tokens), each schedule()
call (tokens per request in vLLM's order, the requests it preempted, free blocks and the usage gauge after it,
the tokens the scheduled requests attend over, the monotonic time it started, and with speculative decoding the
draft tokens scheduled per request), each request finished, and with speculative decoding, after each step, the
drafts verified and accepted per request (`update_from_output`: accepted = tokens sampled - 1, as vLLM counts
them) and the drafts proposed for the next step per request (`update_draft_token_ids`; a prefill chunk's are
dropped, as vLLM drops them). It changes no decision: every method calls vLLM's own. Only vLLM's engine process
imports this module.
"""

import json
import os
import time

from vllm.v1.core.sched.scheduler import Scheduler  # type: ignore[import-not-found]


class RecordingScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._log = open(os.environ["KVBUDGET_SCHEDULE_LOG"], "a", buffering=1)
        self._preempted = []
        pool = self.kv_cache_manager.block_pool
        self._write({"start": True, "num_gpu_blocks": pool.num_gpu_blocks,
                     "block_size": self.block_size, "max_num_seqs": self.max_num_running_reqs,
                     "max_num_batched_tokens": self.max_num_scheduled_tokens,
                     "prefix_caching": self.kv_cache_manager.enable_caching,
                     "groups": len(self.kv_cache_config.kv_cache_groups),
                     "group_block_sizes": [g.kv_cache_spec.block_size for g in self.kv_cache_config.kv_cache_groups],
                     "group_kinds": [type(g.kv_cache_spec).__name__ for g in self.kv_cache_config.kv_cache_groups],
                     "hash_block_size": getattr(self, "hash_block_size", None),
                     "mamba_align": getattr(self, "need_mamba_block_aligned_split", None),
                     "mamba_partial_hits": getattr(self, "mamba_partial_cache_hit", None),
                     "mamba_checkpoint_blocks": getattr(self, "mamba_has_prefill_checkpoint_blocks", None)})

    def _write(self, obj):
        self._log.write(json.dumps(obj) + "\n")

    def add_request(self, request):
        super().add_request(request)
        self._write({"add": request.request_id, "prompt": list(request.prompt_token_ids),
                     "max_tokens": request.max_tokens})

    def _preempt_request(self, request, *args, **kwargs):
        self._preempted.append(request.request_id)
        return super()._preempt_request(request, *args, **kwargs)

    def schedule(self, *args, **kwargs):
        self._preempted = []
        started = time.monotonic()
        out = super().schedule(*args, **kwargs)
        context = sum(self.requests[r].num_computed_tokens for r in out.num_scheduled_tokens)
        self._write({"step": list(out.num_scheduled_tokens.items()), "preempted": self._preempted, "t": started,
                     "tokens": out.total_num_scheduled_tokens, "context": context,
                     "free": self.kv_cache_manager.block_pool.get_num_free_blocks(),
                     "usage": self.kv_cache_manager.usage,
                     "drafts": {r: len(d) for r, d in out.scheduled_spec_decode_tokens.items()}})
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        sampled = model_runner_output.sampled_token_ids
        verified = {}
        for r, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            index = model_runner_output.req_id_to_index.get(r)
            tokens = sampled[index] if sampled and index is not None else []
            if drafts and len(tokens):
                verified[r] = [len(drafts), max(len(tokens) - self.num_sampled_tokens_per_step, 0)]
        if verified:
            self._write({"verified": verified})
        return super().update_from_output(scheduler_output, model_runner_output)

    def update_draft_token_ids(self, draft_token_ids):
        super().update_draft_token_ids(draft_token_ids)
        proposed = {}
        for r in draft_token_ids.req_ids:
            request = self.requests.get(r)
            if request is not None and not request.is_finished() and not request.is_prefill_chunk:
                proposed[r] = len(request.spec_token_ids)
        if proposed:
            self._write({"proposed": proposed})

    def _free_request(self, request, *args, **kwargs):
        self._write({"finished": request.request_id, "output_tokens": request.num_output_tokens})
        return super()._free_request(request, *args, **kwargs)
