"""kvbudget's llama.cpp engine against real llama-server runs (pytest -m engines; scripts/setup_engines.sh first).

Tiny random-weight models are converted with llama.cpp's own convert_hf_to_gguf.py; each case starts
llama-server with -c / -np / --kv-unified / -ctk / -ctv / --swa-full and compares every cache it logs
(`llama_kv_cache: size = ... (N cells, L layers, s/S seqs), K (...): X MiB, V (...): Y MiB`, and the
`llama_memory_recurrent` line) with `LlamaCppEngine.server_buffers`: cells, layers, streams exactly,
and the MiB figures as llama.cpp rounds them (two decimals).

Covered: GQA (llama), all-sliding Mistral (llama.cpp caches it in full), sliding window (gpt-oss),
chunked local (Llama-4), MLA (DeepSeek-V3: one K row, no V), and a Mamba-2 hybrid (Falcon-H1).
Not covered here: Gemma-2/3 and Jamba (the converter wants a SentencePiece tokenizer.model, which our
offline tokenizers are not) and Qwen3-Next (this converter requires MTP layers a tiny model lacks);
their llama.cpp figures are from the source only (README accuracy table).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import gguf_file, run_llama_server
from tiny_configs import TINY

import kvbudget
from kvbudget.engines.llamacpp import LLAMACPP

pytestmark = pytest.mark.engines

W = 300


def cfg(name: str, **changes) -> dict:
    c = dict(TINY[name], vocab_size=320, max_position_embeddings=32768)
    c.update(changes)
    return c


MODELS = {
    "llama": cfg("llama"),
    "llama-hd32": cfg("llama", head_dim=32),
    "mistral": cfg("mistral", sliding_window=W),
    "gpt_oss": cfg("gpt_oss", sliding_window=W),
    "llama4_text": cfg("llama4_text", attention_chunk_size=8192, no_rope_layer_interval=4),
    "deepseek_v3": cfg("deepseek_v3", topk_method="noaux_tc"),
    "deepseek_v3-64": cfg("deepseek_v3", topk_method="noaux_tc", kv_lora_rank=64, qk_rope_head_dim=32),
    "falcon_h1": cfg("falcon_h1", mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=32),
}

# (model, llama-server args, how kvbudget is asked: n_ctx, n_parallel, kv dtype, unified, swa_full)
CASES = {
    "gqa-3-slots": ("llama", ["-c", "1000", "-np", "3"], (1000, 3, "auto", False, False)),
    "gqa-auto-slots-unified": ("llama", ["-c", "5000"], (5000, 4, "auto", True, False)),
    "gqa-unified": ("llama", ["-c", "3000", "-np", "2", "--kv-unified"], (3000, 2, "auto", True, False)),
    "gqa-q8_0": ("llama-hd32", ["-c", "4096", "-np", "1", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"],
                 (4096, 1, "q8_0", False, False)),
    "gqa-q4_0": ("llama-hd32", ["-c", "4096", "-np", "1", "-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on"],
                 (4096, 1, "q4_0", False, False)),
    "gqa-f32": ("llama", ["-c", "2048", "-np", "1", "-ctk", "f32", "-ctv", "f32"], (2048, 1, "fp32", False, False)),
    "mistral-window-ignored": ("mistral", ["-c", "8192", "-np", "1"], (8192, 1, "auto", False, False)),
    "swa-2-slots": ("gpt_oss", ["-c", "8192", "-np", "2"], (8192, 2, "auto", False, False)),
    "swa-unified-4": ("gpt_oss", ["-c", "16384", "-np", "4", "--kv-unified"], (16384, 4, "auto", True, False)),
    "swa-full": ("gpt_oss", ["-c", "8192", "-np", "2", "--swa-full"], (8192, 2, "auto", False, True)),
    "chunked-llama4": ("llama4_text", ["-c", "20000", "-np", "1"], (20000, 1, "auto", False, False)),
    "mla": ("deepseek_v3", ["-c", "4096", "-np", "1"], (4096, 1, "auto", False, False)),
    "mla-q8_0": ("deepseek_v3-64", ["-c", "4096", "-np", "2", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"],
                 (4096, 2, "q8_0", False, False)),
    "hybrid-mamba2": ("falcon_h1", ["-c", "4096", "-np", "2"], (4096, 2, "auto", False, False)),
}


def mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


@pytest.mark.parametrize("case", list(CASES))
def test_llama_server_caches_match(case):
    model_name, args, (n_ctx, n_parallel, dtype, unified, swa_full) = CASES[case]
    run = run_llama_server(gguf_file(model_name, MODELS[model_name]), *args)
    assert run.ok, run.log[-3000:]
    spec = kvbudget.parse_config(MODELS[model_name])
    ours = LLAMACPP.server_buffers(spec, n_ctx, n_parallel, dtype, unified=unified, swa_full=swa_full)
    logged_kv = [c for c in run.caches if c["kind"] == "llama_kv_cache"]
    logged_rs = [c for c in run.caches if c["kind"] == "llama_memory_recurrent"]
    ours_kv = [b for b in ours if b.name != "recurrent"]  # non-SWA first, then SWA, as llama.cpp logs them
    ours_rs = [b for b in ours if b.name == "recurrent"]
    assert len(logged_kv) == len(ours_kv) and len(logged_rs) == len(ours_rs)
    for logged, buf in zip(logged_kv + logged_rs, ours_kv + ours_rs):
        assert (logged["cells"], logged["layers"]) == (buf.cells, buf.layers)
        if logged["kind"] == "llama_kv_cache":
            assert logged["streams"] == buf.streams
        assert f"{logged['k_mib']:.2f}" == mib(buf.k_bytes), buf
        assert f"{logged['v_mib']:.2f}" == mib(buf.v_bytes), buf
        assert f"{logged['mib']:.2f}" == mib(buf.total_bytes), buf


def test_llama_server_refuses_a_block_type_that_does_not_divide_the_head_dim():
    """Head dim 24 with q8_0: llama.cpp will not start, and kvbudget says why before anyone tries."""
    run = run_llama_server(gguf_file("llama", MODELS["llama"]), "-c", "1024", "-ctk", "q8_0", "-ctv", "q8_0",
                           "-fa", "on")
    assert not run.ok and "does not divide n_embd_head_k=24" in run.log
    with pytest.raises(kvbudget.KVBudgetError, match="multiple of the 32-value block"):
        LLAMACPP.server_buffers(kvbudget.parse_config(MODELS["llama"]), 1024, 1, "q8_0")


def _last_compute_mib(log: str) -> float:
    """The compute buffer of the load that serves (llama-server's fit pass logs one first)."""
    import re

    return float(re.findall(r"CPU compute buffer size =\s+([\d.]+) MiB", log)[-1])


@pytest.mark.parametrize("fa", ["on", "off"])
@pytest.mark.parametrize("model_name", ["llama", "mistral", "gpt_oss", "llama4_text", "falcon_h1"])
def test_the_compute_buffer_grows_with_the_context_as_kvbudget_says(model_name, fa):
    """From 2,048 to 8,192 cells llama-server's compute buffer grows by what `attention_scratch` says (the KQ masks,
    and without flash attention one layer's scores), to the 0.01 MiB it prints."""
    from kvbudget.engines.llamacpp.engine import attention_scratch, pad
    from kvbudget.engines.llamacpp.releases import Release

    logs = {}
    for ctx in (2048, 8192):
        run = run_llama_server(gguf_file(model_name, MODELS[model_name]), "-c", str(ctx), "-np", "1", "-fa", fa)
        assert run.ok, run.log[-3000:]
        logs[ctx] = _last_compute_mib(run.log)
    spec, release, flash = kvbudget.parse_config(MODELS[model_name]), Release(), fa == "on"
    grown = (attention_scratch(spec, pad(8192, release.padding(flash)), 512, flash, release)
             - attention_scratch(spec, pad(2048, release.padding(flash)), 512, flash, release))
    assert abs(grown / 2**20 - (logs[8192] - logs[2048])) <= 0.01, (grown / 2**20, logs)


@pytest.mark.parametrize(("fa", "slots"), [("on", ["-np", "2"]), ("off", ["-np", "3", "--kv-unified"])])
def test_the_replayed_compute_buffer_is_what_a_live_server_reserves(fa, slots):
    """The bundled SmolLM2 GGUF at settings the recorded data lacks (-c 3000, -ub 384, two or three slots): the
    compute buffer kvbudget replays from llama.cpp's graph is the one llama-server prints, to its 0.01 MiB."""
    from kvbudget.bundled import bundled_gguf
    from kvbudget.engines.llamacpp.releases import Release

    run = run_llama_server(bundled_gguf(), "-c", "3000", "-ub", "384", "-fa", fa, *slots)
    assert run.ok, run.log[-3000:]
    model = kvbudget.load_model(Path(__file__).parents[1] / "data" / "logs" / "smollm2-135m-instruct.config.json")
    n_parallel, unified, flash = int(slots[1]), "--kv-unified" in slots, fa == "on"
    cells = LLAMACPP.server_buffers(model, 3000, n_parallel, unified=unified, flash_attn=flash, n_ubatch=384)[0].cells
    size, replayed = LLAMACPP.compute_buffer(model, cells, 384, n_parallel, flash, Release())
    assert replayed and f"{size / 2**20:.2f}" == f"{_last_compute_mib(run.log):.2f}"
