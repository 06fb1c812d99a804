"""The profiling sampler of vLLM 0.9-0.11 when it runs on FlashInfer (engines/vllm/sampler.py): what it holds per
logit, worked from the source (v1/worker/gpu_model_runner.py _dummy_sampler_run, v1/sample/sampler.py,
v1/sample/ops/topk_topp_sampler.py of 0.10.1.1; flashinfer/sampling.py of flashinfer 0.2.11), and where the setting
is refused."""

from __future__ import annotations

import pytest

from kvbudget import load_model, plan
from kvbudget.cli import main
from kvbudget.engines import EngineOptions
from kvbudget.errors import EngineRuleError
from kvbudget.units import GIB

QWEN2_VOCAB = 152064  # Qwen2-7B-Instruct's config.json vocab_size
# engine/arg_utils.py (0.9 on): an A100 keeps the small tier's max_num_seqs, 256, whatever its memory
A100_SEQS = 256


def _stack(version: tuple[int, int], flashinfer: bool, engine: str = "vllm") -> dict[str, int]:
    p = plan(load_model("qwen2-7b"), engine=engine, gpu="A100-80GB", max_model_len=16384, utilization=0.25,
             options=EngineOptions(engine_version=version, max_num_batched_tokens=2048,
                                   flashinfer_sampler=flashinfer), recommend=False)
    return {t.key: t.bytes for t in p.stack}


def test_flashinfers_sampler_holds_what_the_source_allocates():
    """256 rows of the full vocabulary: compute_logits's bfloat16 logits (kept by _dummy_sampler_run, 2 bytes), the
    sampler's float32 copy (4), top_k_mask_logits's float32 output (4) and the softmax over it (4)."""
    rows = min(2048, A100_SEQS)
    assert _stack((0, 10), True)["activation"] == rows * QWEN2_VOCAB * (2 + 4 + 4 + 4)
    assert rows * QWEN2_VOCAB * 14 / GIB == pytest.approx(0.508, abs=0.001)


def test_the_sorting_sampler_still_takes_the_fitted_figure_and_the_budget_moves_by_the_difference():
    """Without FlashInfer (pip's vLLM; the log says 'FlashInfer is not available') the sampler sorts: the fitted
    39 bytes per logit; the budget differs by the 25 bytes per logit the sort holds beyond FlashInfer's kernel."""
    sort, flashinfer = _stack((0, 10), False), _stack((0, 10), True)
    rows = A100_SEQS
    assert sort["activation"] == rows * QWEN2_VOCAB * 39
    assert flashinfer["kv"] - sort["kv"] == rows * QWEN2_VOCAB * (39 - 14)


def test_dennislee_qwen2_7b_at_a_quarter_of_an_a100():
    """dennislee22/vLLM-benchmarking, log/vllm-7B-1gpuA10080GB-0.25GRAM.log (vLLM 0.10.1.1, 'Using FlashInfer for
    top-p & top-k sampling'): weights 14.2488 GiB, 'Available KV cache memory: 5.01 GiB'. The share less both leaves
    0.5-0.6 GiB for the profile and non-torch memory (torch sees about 79.2 GiB of an A100 80 GB); the sorting
    sampler alone was planned at 1.41 GiB, FlashInfer's is 0.51."""
    logged_kv, logged_weights = 5.01, 14.2488
    left = 0.25 * 79.2 - logged_weights - logged_kv
    stack = _stack((0, 10), True)
    assert 0.5 < left < 0.6
    assert stack["activation"] / GIB < left < _stack((0, 10), False)["activation"] / GIB


@pytest.mark.parametrize("version", [(0, 8), (0, 12), (0, 19), (0, 6)])
def test_flashinfer_sampler_is_refused_where_its_source_is_not_read(version):
    with pytest.raises(EngineRuleError, match="flashinfer_sampler: .* 0.9 to 0.11") as caught:
        _stack(version, True)
    assert caught.value.param == "flashinfer_sampler"


def test_flashinfer_sampler_is_a_vllm_setting():
    with pytest.raises(EngineRuleError, match="flashinfer_sampler: a vLLM setting") as caught:
        _stack((0, 4, 9), True, engine="sglang")
    assert caught.value.param == "flashinfer_sampler"


def test_the_cli_refuses_it_in_one_line(capsys):
    code = main(["plan", "qwen2-7b", "--gpu", "A100-80GB", "--engine", "vllm@0.14", "--flashinfer-sampler"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "--flashinfer-sampler" in err and "0.9 to 0.11" in err


# check-log reads the sampler from the log's own line (dennislee22/vLLM-benchmarking, log/vllm-7B-1gpuA10080GB-
# 0.25GRAM.log and log/vllm-7B-2gpuA10040GB-0.5GRAM-diff-nodes.log, vLLM 0.10.1.1)
BANNER = "(APIServer pid=1671) INFO 09-04 01:02:37 [api_server.py:1805] vLLM API server version 0.10.1.1\n"
WITH = ("(EngineCore_0 pid=1812) INFO 09-04 01:02:57 [topk_topp_sampler.py:50] Using FlashInfer for top-p & top-k "
        "sampling.\n")
WITHOUT = ("(EngineCore_0 pid=1257) (RayWorkerWrapper pid=374, ip=10.254.6.219) WARNING 09-03 04:38:28 "
           "[topk_topp_sampler.py:61] FlashInfer is not available. Falling back to the PyTorch-native implementation "
           "of top-p & top-k sampling. For the best performance, please install FlashInfer.\n")


@pytest.mark.parametrize(("text", "expected"), [
    (BANNER + WITH, True),
    (BANNER + WITHOUT, False),
    (BANNER.replace("0.10.1.1", "0.8.5") + WITH, False),  # 0.8.5's FlashInfer path is another API: not modelled
])
def test_check_log_reads_the_sampler_the_log_names(text, expected):
    from kvbudget.engines.vllm.logsettings import read_settings

    settings, read, _ = read_settings(text, {"max_model_len": 16384}, None, None)
    assert settings.flashinfer_sampler is expected and settings.options().flashinfer_sampler is expected
    assert read.get("flashinfer_sampler", False) is expected


@pytest.mark.parametrize(("version", "hinted"), [((0, 9), True), ((0, 11), True), ((0, 8), False), ((0, 12), False)])
def test_the_plan_says_where_flashinfer_would_sample(version, hinted):
    """0.9-0.11 sample with FlashInfer whenever it is installed: a plan for them without the setting says so."""
    p = plan(load_model("qwen2-7b"), engine="vllm", gpu="A100-80GB", max_model_len=16384,
             options=EngineOptions(engine_version=version), recommend=False)
    note = {t.key: t.note for t in p.stack}["activation"]
    assert ("set flashinfer_sampler" in note) is hinted and "fit: 39 bytes per logit" in note
