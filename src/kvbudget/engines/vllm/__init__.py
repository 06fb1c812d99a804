"""vLLM: everything kvbudget knows about it, one module per job.

- `engine`: the block layout, capacity and serving defaults (`VLLMEngine`, the registered `VLLM`);
- `packed`: DeepSeek-V4's packed groups of different page sizes;
- `releases`: what changed between releases (`--engine vllm@0.8.5`);
- `logs`: reading its startup logs back (check-log);
- `blocks`, `pool`, `scheduler`, `contiguous`: its KV cache groups, block pool and scheduler for the simulator,
  and the contiguous-allocation baselines of the PagedAttention paper.
"""

from kvbudget.engines.vllm.engine import VLLM, VLLMEngine

__all__ = ["VLLM", "VLLMEngine"]
