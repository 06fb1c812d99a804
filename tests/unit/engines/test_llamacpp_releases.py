"""llama.cpp builds: what each era of llama-server allocated (engines/llamacpp/releases.py). Expected cells are
worked out by hand from the formulas quoted in the module's docstring (the vendored llama.cpp of the
llama-cpp-python sdists), not from kvbudget's own code."""

from __future__ import annotations

import json

import pytest

from kvbudget import load_model
from kvbudget.cli import main
from kvbudget.engines import EngineOptions
from kvbudget.engines.llamacpp import LLAMACPP
from kvbudget.engines.llamacpp.releases import NEWEST, PAD_256, SWA_CACHE, Release, parse_build
from kvbudget.errors import EngineRuleError
from kvbudget.units import MIB


def cells(model: str, n_ctx: int, n_parallel: int = 1, **kw) -> dict[str, tuple[int, int, int]]:
    """name -> (cells per stream, streams, layers)"""
    return {b.name: (b.cells, b.streams, b.layers)
            for b in LLAMACPP.server_buffers(load_model(model), n_ctx, n_parallel, **kw)}


def test_padding_by_era_and_flash_attention():
    # -c 5000: 32-cell padding without flash attention before #16812, 256 with it, none in the #16812 window,
    # 256 whatever -fa from #17046
    assert cells("llama-3.1-8b", 5000, release=Release(6000), flash_attn=False)["kv"][0] == 5024
    assert cells("llama-3.1-8b", 5000, release=Release(6000), flash_attn=True)["kv"][0] == 5120
    assert cells("llama-3.1-8b", 5000, release=Release(6000))["kv"][0] == 5024  # -fa off was the default then
    assert cells("llama-3.1-8b", 5000, release=Release(6500))["kv"][0] == 5120  # -fa auto counts as on
    assert cells("llama-3.1-8b", 5000, release=Release(6960), flash_attn=False)["kv"][0] == 5000
    assert cells("llama-3.1-8b", 5000, flash_attn=False)["kv"][0] == 5120


def test_sliding_windows_by_era():
    # gemma-2-9b: 42 layers alternating local (window 4096) and global; -c 8192 -np 1
    assert cells("gemma-2-9b", 8192, release=Release(5000)) == {"kv": (8192, 1, 42)}  # one cache, windows in full
    # #13194: pad(n_swa x n_seq + n_batch) = pad(4096 + 2048) = 6144
    assert cells("gemma-2-9b", 8192, release=Release(5500))["kv_swa"] == (6144, 1, 21)
    # #13833: + n_ubatch: pad(4096 + 512) = 4608
    assert cells("gemma-2-9b", 8192, release=Release(5700))["kv_swa"] == (4608, 1, 21)
    # four sequences before per-sequence streams: one stream, window x 4 + 512 = 16896 > 8192 cells: capped
    assert cells("gemma-2-9b", 8192, 4, release=Release(5700)) == {"kv": (8192, 1, 21), "kv_swa": (8192, 1, 21)}
    # from #14363 each of the 4 streams holds 8192 / 4 = 2048 cells; the window cache min(2048, 4608)
    assert cells("gemma-2-9b", 8192, 4, release=Release(6000)) == {"kv": (2048, 4, 21), "kv_swa": (2048, 4, 21)}


def test_streams_round_up_before_16812_and_down_after():
    # -c 1000 -np 3 without flash attention in the 32-cell era: ceil(1000 / 3) = 334 -> 352 per stream
    assert cells("llama-3.1-8b", 1000, 3, release=Release(6000), flash_attn=False)["kv"][:2] == (352, 3)
    # newest: pad(1000) = 1024, 1024 // 3 = 341 -> 512 per stream
    assert cells("llama-3.1-8b", 1000, 3)["kv"][:2] == (512, 3)


def test_the_estimate_follows_the_build():
    model = load_model("gemma-2-9b")
    old = LLAMACPP.allocate(model, options=EngineOptions(engine_version=(5000,)))
    new = LLAMACPP.allocate(model)
    assert old.sequence_bytes(8192) > new.sequence_bytes(8192)  # windows cached in full before #13194
    per_layer = 2 * 8 * 256 * 2  # K + V, 8 KV heads x 256, f16
    assert old.sequence_bytes(8192) == 42 * 8192 * per_layer
    assert new.sequence_bytes(8192) == 21 * 8192 * per_layer + 21 * 4608 * per_layer


def test_builds_inside_a_window_say_so():
    assert Release(SWA_CACHE.last_without).own_swa_cache is False
    inside = Release(SWA_CACHE.last_without + 1)
    assert inside.own_swa_cache and any("#13194" in n for n in inside.notes())
    assert Release(PAD_256.first_with).notes() == () and NEWEST.notes() == ()


def test_parse_build_and_the_cli(capsys):
    assert parse_build("b6182") == 6182 and parse_build("6182") == 6182
    for bad in ("latest", "b12", "0.3.16"):
        with pytest.raises(EngineRuleError):
            parse_build(bad)
    assert main(["estimate", "gemma-2-9b", "--engine", "llamacpp@b5000", "--context", "8192", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bytes_per_token"] == 42 * 2 * 8 * 256 * 2
    assert main(["estimate", "llama-3.1-8b", "--engine", "llamacpp", "--attention-backend", "FLASHMLA"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


LOG_5500 = """build: 5500 (0123abcd) with cc for x86_64-linux-gnu
llama_context: n_seq_max     = 1
llama_context: n_ctx         = 8192
llama_context: n_ctx_per_seq = 8192
llama_context: n_batch       = 2048
llama_context: n_ubatch      = 512
llama_context: flash_attn    = 0
llama_kv_cache_unified_iswa: creating non-SWA KV cache, size = 8192 cells
llama_kv_cache_unified: size = {base} MiB (  8192 cells,  21 layers,  1 seqs), K (f16): {half} MiB, V (f16): {half} MiB
llama_kv_cache_unified_iswa: creating     SWA KV cache, size = {swa} cells
llama_kv_cache_unified: size = {swa_mib} MiB ({swa:6d} cells,  21 layers,  1 seqs), K (f16): {sh} MiB, V (f16): {sh} MiB
"""


def _log(swa: int, build: str = "build: 5500 (0123abcd)") -> str:
    row = 21 * 2 * 8 * 256 * 2  # bytes per cell over the 21 layers of one cache
    return LOG_5500.replace("build: 5500 (0123abcd)", build).format(
        base=f"{8192 * row / MIB:.2f}", half=f"{8192 * row / 2 / MIB:.2f}", swa=swa,
        swa_mib=f"{swa * row / MIB:.2f}", sh=f"{swa * row / 2 / MIB:.2f}")


def test_check_log_takes_the_build_from_the_log():
    model = load_model("gemma-2-9b")
    check = LLAMACPP.check_log(_log(6144), model)  # b5500: + n_batch
    assert check.all_match and check.settings["build"] == "b5500"
    assert not LLAMACPP.check_log(_log(4608), model).all_match  # what b5554 on would hold
    # without a build line, the era whose rules reproduce the lines is found and named as assumed
    check = LLAMACPP.check_log(_log(4608, build="no build line here"), model)
    assert check.all_match and "b5700" in check.assumed["build"]
