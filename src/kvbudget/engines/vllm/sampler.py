"""What vLLM V1's profiling sampler holds per logit when it samples with FlashInfer, from the source.

vLLM 0.9 to 0.11 sample top-k / top-p with FlashInfer whenever it is installed (v1/sample/ops/topk_topp_sampler.py
of 0.9.2, 0.10.1.1 and 0.11.0: TopKTopPSampler takes forward_cuda when flashinfer >= 0.2.3 imports and
VLLM_USE_FLASHINFER_SAMPLER is not set to 0; the log says "Using FlashInfer for top-p & top-k sampling"). vLLM's
Docker image installs FlashInfer (docker/Dockerfile of 0.10.1.1: v0.2.11); `pip install vllm` does not (an extra,
setup.py), and then the log says "FlashInfer is not available" and the sampler sorts (memory.LOGIT_BYTES, fitted).
0.8.5 turned FlashInfer's sampler off for flashinfer >= 0.2.3 and called an older API below it; from 0.12 it is
opt-in (VLLM_USE_FLASHINFER_SAMPLER=1) beside other kernels: neither is read here, so the setting is refused there.

The profiling pass's sampler (gpu_model_runner.py _dummy_sampler_run, top_k vocab - 1 and top_p 0.9 on every row)
holds at its peak, per logit of its min(max_num_batched_tokens, max_num_seqs) rows:
- the logits compute_logits returned, in the model's 16-bit dtype, which _dummy_sampler_run keeps: 2 bytes;
- their float32 copy (sampler.py forward: `logits.to(torch.float32)`; the temperature is applied in place): 4;
- FlashInfer's top_k_top_p_sampling_from_logits (flashinfer/sampling.py of the releases vLLM's Docker images pin:
  0.2.6.post1 for 0.9.2, 0.2.11 for 0.10.1.1, 0.3.1 for 0.11.0, all alike; filter_apply_order "top_k_first"):
  top_k_mask_logits's output (`torch.empty_like(logits)`, float32), 4, and the softmax over it, 4, both held while
  top_p_sampling_from_probs samples (its `probs.float()` copies nothing).
"""

from __future__ import annotations

from kvbudget.engines.vllm.memory import logit_bytes
from kvbudget.engines.vllm.releases import Release
from kvbudget.errors import EngineRuleError

FLASHINFER_RELEASES = ((0, 9), (0, 11))  # where the rule above is read: FlashInfer's sampler by default when installed
FLASHINFER_LOGIT_BYTES = 2 + 4 + 4 + 4  # 16-bit logits, their float32 copy, the top-k masked copy, the softmax


def flashinfer_logit_bytes(rel: Release) -> tuple[int, str]:
    """Bytes FlashInfer's sampler holds per logit at the profiling peak of release `rel`, and the note; refused
    outside the releases whose source is read."""
    low, high = FLASHINFER_RELEASES
    if not low <= rel.version <= high:
        raise EngineRuleError(
            f"flashinfer_sampler: kvbudget models FlashInfer's top-k / top-p sampler for vLLM {low[0]}.{low[1]} to "
            f"{high[0]}.{high[1]} (their default where FlashInfer is installed), not {rel.label}; leave it out",
            param="flashinfer_sampler")
    return FLASHINFER_LOGIT_BYTES, (f"FlashInfer's sampler, from the source: {FLASHINFER_LOGIT_BYTES} bytes per "
                                    "logit, the 16-bit logits, a float32 copy, the top-k mask and the softmax")


def sampler_logit_bytes(rel: Release, flashinfer: bool) -> tuple[int, str]:
    """Bytes per logit the profiling sampler of release `rel` holds at its peak (`flashinfer`: it samples with
    FlashInfer), and the note; where the release would sample with FlashInfer if it were installed, the note says
    so."""
    if flashinfer:
        return flashinfer_logit_bytes(rel)
    fitted = logit_bytes(rel)
    low, high = FLASHINFER_RELEASES
    hint = (f"; where FlashInfer is installed (vLLM's Docker image) {rel.label} samples with it, "
            f"{FLASHINFER_LOGIT_BYTES} bytes per logit: set flashinfer_sampler" if low <= rel.version <= high else "")
    return fitted, f"fit: {fitted} bytes per logit{hint}"
