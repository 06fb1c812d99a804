"""Projections and experts timed by the kernels of the weights' own format (data/steptimes: aiconfigurator's fp8,
MXFP4 and int4 rows beside the 16-bit ones), 16-bit kernels standing in, labelled, where a GPU has none; each part
of the weights counted in its own format's bytes."""

from __future__ import annotations

import csv
import statistics
from dataclasses import replace
from importlib import resources

import pytest

import kvbudget
from kvbudget.gpus import find_gpu
from kvbudget.model.load import load_model
from kvbudget.model.weights import WeightFormat, weight_formats
from kvbudget.simulation import setup_for, steptimes

FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}  # per tensor (no weight_block_size)


def _llama(quantization: dict | None = None):
    config = dict(load_model("llama-3.1-8b").config)
    if quantization is not None:
        config["quantization_config"] = quantization
    return load_model(config, name="llama-3.1-8b")


def _work(model, gpu: str):
    p = kvbudget.plan(model, gpu=gpu, max_model_len=4096)
    work = steptimes.step_work(model, p)
    kernels = steptimes.kernels_for(find_gpu(gpu))
    assert work is not None and kernels is not None
    return work, kernels, p


def _rows(gpu_file: str) -> list[dict[str, str]]:
    text = (resources.files("kvbudget") / "data" / "steptimes" / gpu_file).read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines()))


def test_an_fp8_model_on_a_gpu_with_fp8_rows_runs_its_projections_at_the_measured_fp8_rate():
    """Llama-3.1-8B in fp8 on an H200: its projections use the fp8 fit (nothing in the basis says bf16), and a
    prefill of 8,192 tokens computes them faster than the same model timed with the 16-bit kernels, by about the
    ratio the H200's own rows show where a call's time is its compute (the same shape and tokens in both formats,
    over 10^12 FLOPs a call: bf16 time / fp8 time, a median of 1.48). Within 20%: the one fit per format also
    spans the shapes where fp8's quantization of the activations costs more than its faster compute saves (many
    tokens through a small weight: 0.58 there), and comes out at 1.25."""
    model = _llama(FP8)
    work, kernels, _ = _work(model, "H200")
    assert work.dense_format is WeightFormat.FP8
    card = find_gpu("H200")
    fp8 = steptimes.time_model(work, kernels, card)
    bf16 = steptimes.time_model(replace(work, dense_format=WeightFormat.BF16), kernels, card)
    assert "bf16" not in fp8.basis
    rows = _rows("h200-sxm.csv")
    by_shape = {(r["layer"], r["tokens"]): float(r["time_us"]) for r in rows if r["op"] == "gemm"}
    ratios = [by_shape[key] / float(r["time_us"]) for r in rows if r["op"] == "gemm_fp8"
              and float(r["flops"]) > 1e12 and (key := (r["layer"], r["tokens"])) in by_shape]
    assert len(ratios) > 20
    measured = statistics.median(ratios)
    assert measured > 1.3  # (fp8 GEMMs are faster where compute-bound)
    assert bf16.per_token / fp8.per_token == pytest.approx(measured, rel=0.20)
    assert bf16.per_token / fp8.per_token > 1.1
    tokens = 8192
    assert fp8.step_seconds(tokens, tokens) < bf16.step_seconds(tokens, tokens)


def test_a_gpu_without_fp8_rows_runs_fp8_projections_on_its_16_bit_kernels_and_says_so():
    """The A100 has no fp8 units and aiconfigurator's A100 tables no fp8 rows: an fp8 model's projections run at
    the 16-bit fit's rate, labelled. An H100 PCIe (no measurements) takes fp8 projections from the measured GPUs
    of its architecture (the H100 SXM and H200), labelled."""
    fp8, plain = _llama(FP8), _llama()
    a100 = setup_for(fp8, gpu="A100-80GB", max_model_len=4096).time_model
    assert "; fp8 projections from bf16 kernels (estimate)" in a100.basis
    assert a100.per_token == setup_for(plain, gpu="A100-80GB", max_model_len=4096).time_model.per_token
    pcie = setup_for(fp8, gpu="H100-PCIe", max_model_len=4096).time_model
    assert "; fp8 projections from H100-80GB, H200 (estimate)" in pcie.basis
    # a 16-bit model on the same cards says nothing of quantized kernels
    assert "fp8" not in setup_for(plain, gpu="H100-PCIe", max_model_len=4096).time_model.basis


def test_block_fp8_projections_run_on_the_per_tensor_fp8_kernels_labelled():
    """aiconfigurator times its block-fp8 GEMMs on one L2-resident weight outside CUDA graphs, so none of those rows
    is taken: a block-fp8 checkpoint's projections run on the per-tensor fp8 fit, labelled; its experts on the
    measured block-fp8 MoE kernels (Qwen3-30B-A3B on an H200)."""
    config = dict(load_model("qwen3-30b-a3b").config)
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    model = load_model(config, name="qwen3-30b-a3b")
    work, kernels, _ = _work(model, "H200")
    tm = steptimes.time_model(work, kernels, find_gpu("H200"))
    assert "; fp8-block projections from fp8 per-tensor kernels (estimate)" in tm.basis
    assert "experts" not in tm.basis
    assert tm.per_token == pytest.approx(work.flops_per_token / kernels.ops["moe_fp8_block"].throughput)
    assert not any(r["op"] == "gemm_fp8_block" for r in _rows("h200-sxm.csv"))


def test_16_bit_models_step_as_before():
    """Step times of 16-bit models, recorded before quantized kernels were added (prefill of 2,048 tokens; 64
    sequences decoding after 1,024 tokens): unchanged."""
    for name, gpu, prefill, decode in (("llama-3.1-8b", "H200", 0.0447359140157164, 0.007384351403532883),
                                       ("qwen3-30b-a3b", "H200", 0.02958954720556903, 0.016758047058278925),
                                       ("llama-3.1-8b", "H100-80GB", 0.0462948547299772, 0.009340216769464305),
                                       ("qwen3-30b-a3b", "A100-80GB", 0.06094888573074108, 0.048401425487662575)):
        tm = setup_for(load_model(name), gpu=gpu, max_model_len=4096).time_model
        assert tm.step_seconds(2048, 2048) == pytest.approx(prefill, rel=1e-9), (name, gpu)
        assert tm.step_seconds(64, 64 * 1025) == pytest.approx(decode, rel=1e-9), (name, gpu)


def test_gpt_oss_counts_its_16_bit_attention_apart_from_its_mxfp4_experts():
    """gpt-oss-120b by hand from its config (hidden 2,880, 36 layers, 128 experts of 2,880, 64 query and 8 KV
    heads of 64, biases, vocabulary 201,088): experts 36 x 128 x (2,880 x 5,760 + 5,760 + 2,880 x 2,880 + 2,880)
    parameters at MXFP4's 4.25 bits; attention 36 x (2,880 x 4,096 + 4,096 + 2 x (2,880 x 512 + 512) + 4,096 x
    2,880 + 2,880 + 64 sinks) and the router 36 x (2,880 x 128 + 128) at 16 bits; the LM head 201,088 x 2,880 at
    16 bits. On an H200 its experts run on the measured MXFP4 MoE kernels."""
    model = load_model("gpt-oss-120b")
    assert weight_formats(model) == (WeightFormat.BF16, WeightFormat.MXFP4)
    work, kernels, p = _work(model, "H200")
    assert not p.weights.exact
    experts = 36 * 128 * (2880 * 5760 + 5760 + 2880 * 2880 + 2880)
    attention = 36 * (2880 * 4096 + 4096 + 2 * (2880 * 512 + 512) + 4096 * 2880 + 2880 + 64)
    router = 36 * (2880 * 128 + 128)
    assert work.expert_bytes == pytest.approx(experts * 4.25 / 8, rel=1e-9)
    assert work.weight_bytes == pytest.approx((attention + router) * 2, rel=1e-9)
    assert work.lm_head_bytes == pytest.approx(201088 * 2880 * 2, rel=1e-9)
    tm = steptimes.time_model(work, kernels, find_gpu("H200"))
    assert tm.experts == pytest.approx(work.expert_bytes / kernels.ops["moe_w4a16_mxfp4"].bandwidth)
    assert "bf16" not in tm.basis


@pytest.mark.parametrize(("quantization", "formats"), [
    (None, ("BF16", "BF16")),
    ({"quant_method": "fp8"}, ("FP8", "FP8")),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, ("FP8_BLOCK", "FP8_BLOCK")),
    ({"quant_method": "mxfp4"}, ("BF16", "MXFP4")),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, ("INT4", "INT4")),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, ("OTHER", "OTHER")),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
        "num_bits": 8, "type": "float", "strategy": "channel"}}}}, ("FP8", "FP8")),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}}}, ("INT4", "INT4")),
])
def test_the_weights_format_is_read_from_the_quantization_config(quantization, formats):
    assert tuple(f.name for f in weight_formats(_llama(quantization))) == formats


def test_quantized_rows_count_their_weights_in_their_own_format(extractor):
    """By hand: an fp8 GEMM of 8 tokens through a 4,096 x 4,096 weight reads 16 MiB (one byte a weight); an
    MXFP4 MoE row of 4 tokens through all 8 Mixtral-shaped experts reads 4.25 bits a weight; block-fp8 GEMM rows
    are not taken (see the extractor's ONE_COPY)."""
    gemm = dict(m=8, n=4096, k=4096, latency=0.02)
    (fp8,) = extractor.aic_gemm([dict(gemm, gemm_dtype="fp8")], "fp8")
    assert (fp8["op"], fp8["flops"], fp8["bytes"], fp8["time_us"]) == ("gemm_fp8", 268435456, 16777216, 20.0)
    assert extractor.aic_gemm([dict(gemm, gemm_dtype="fp8_block")], "fp8_block") == []
    assert extractor.aic_gemm([dict(gemm, gemm_dtype="fp8")]) == []  # (the 16-bit pass takes no fp8 row)
    moe = dict(moe_dtype="w4a16_mxfp4", distribution="balanced", moe_tp_size=1, moe_ep_size=1, num_tokens=4,
               hidden_size=4096, inter_size=14336, topk=2, num_experts=8, latency=0.3)
    (r,) = extractor.aic_moe([moe], "w4a16_mxfp4")
    assert (r["op"], r["bytes"]) == ("moe_w4a16_mxfp4", 8 * 3 * 4096 * 14336 * 17 // 32)


