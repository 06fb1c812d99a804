"""What a running vLLM states about its KV cache: the pool in its /metrics (cache_config_info)."""

from __future__ import annotations

import re

from kvbudget.engines.metrics import PoolReport, whole_number


def vllm_pool(text: str) -> PoolReport | None:
    """vLLM's /metrics: `vllm:cache_config_info{...num_gpu_blocks="N",block_size="B"...} 1` (every cache setting
    as a label, v1/metrics/loggers.py `log_metrics_info`; num_gpu_blocks is the sum over data-parallel engines)."""
    m = re.search(r"^vllm:cache_config_info\{([^}]*)\}", text, re.M)
    if m is None:
        return None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    blocks, size = whole_number(labels.get("num_gpu_blocks")), whole_number(labels.get("block_size"))
    if blocks is None or size is None:
        return None
    return PoolReport(tokens=blocks * size, blocks=blocks, block_size=size,
                      source=f"/metrics cache_config_info: {blocks:,} blocks of {size}")
