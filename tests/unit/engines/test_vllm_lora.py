"""vLLM's LoRA slots (engines/vllm/lora.py), worked by hand from vLLM 0.32's lora/layers; a real vLLM process holds
the same bytes (tests/engines/test_vllm_real.py::test_vllm_lora_slots_are_the_plans)."""

from __future__ import annotations

import pytest

from kvbudget import EngineOptions, load_model, plan
from kvbudget.cli import main
from kvbudget.engines.vllm.lora import lora_bytes
from kvbudget.errors import EngineRuleError


def test_llama_3_1_8b_one_slot_of_rank_16():
    """Per layer and rank: QKV A 3 x 4,096 + B 4,096 + 2 x 1,024; output A 4,096 + B 4,096; gate/up A 2 x 4,096 +
    B 2 x 14,336; down A 14,336 + B 4,096 = 81,920. Embedding and LM head: 2 x (128,256 + 4,096) = 264,704.
    16 x (264,704 + 32 x 81,920) = 46,178,304 values of 2 bytes."""
    assert lora_bytes(load_model("llama-3.1-8b"), 1, 16, 1)[0] == 92_356_608
    # under tensor parallelism the split projections halve; A of QKV and gate/up, B of output and down, and the
    # embedding and LM head stay whole: 16 x (264,704 + 32 x (28,672 + 53,248 / 2)) per rank
    assert lora_bytes(load_model("llama-3.1-8b"), 1, 16, 2)[0] == 2 * 16 * (264_704 + 32 * (28_672 + 26_624))


def test_the_plan_counts_the_slots_with_the_weights():
    model = load_model("llama-3.1-8b")

    def weights(**lora: object) -> int:
        p = plan(model, gpu="H100-80GB", max_model_len=8192, options=EngineOptions(**lora), recommend=False)  # type: ignore[arg-type]
        return {t.key: t.bytes for t in p.stack}["weights"]

    assert weights(enable_lora=True, max_loras=4, max_lora_rank=64) - weights() == 4 * 4 * 92_356_608


def test_what_vllm_refuses_is_refused(capsys):
    with pytest.raises(EngineRuleError, match="max_lora_rank 48"):
        lora_bytes(load_model("llama-3.1-8b"), 1, 48, 1)
    assert main(["plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-loras", "4"]) == 2
    assert "--enable-lora" in capsys.readouterr().err
    assert main(["plan", "qwen3-30b-a3b", "--gpu", "H100-80GB", "--enable-lora"]) == 2  # an MoE: not modelled
    assert capsys.readouterr().err.count("\n") == 1
