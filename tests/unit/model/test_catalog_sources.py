"""The bundled catalog against what the models' makers published (issue 50: Llama-2-13B and 70B carried the
2,048-token context of an older copy where their config.json and paper say 4,096). Each expected value below comes
from the paper or model card named beside it, never from the catalog's own files."""

from __future__ import annotations

import json

import pytest

from kvbudget import catalog, load_model

# name -> {config field: published value}, each with its publication
PUBLISHED = {
    # Llama 2 paper (Touvron et al. 2023), Table 1: context length 4k for every size; GQA for 70B with 8 KV heads
    "llama-2-7b": {"max_position_embeddings": 4096, "num_hidden_layers": 32, "num_key_value_heads": 32},
    "llama-2-13b": {"max_position_embeddings": 4096, "num_hidden_layers": 40, "num_key_value_heads": 40},
    "llama-2-70b": {"max_position_embeddings": 4096, "num_hidden_layers": 80, "num_key_value_heads": 8},
    # Llama 3.1 model card: 128k context; 405B: 126 layers (The Llama 3 Herd of Models, Table 3)
    "llama-3.1-8b": {"max_position_embeddings": 131072, "num_hidden_layers": 32, "num_key_value_heads": 8},
    "llama-3.1-70b": {"max_position_embeddings": 131072, "num_hidden_layers": 80, "num_key_value_heads": 8},
    "llama-3.1-405b": {"max_position_embeddings": 131072, "num_hidden_layers": 126, "num_key_value_heads": 8},
    # Mistral 7B paper (Jiang et al. 2023), Table 1: 32 layers, 8 KV heads, window 4096
    "mistral-7b": {"num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096},
    # Mixtral of Experts (Jiang et al. 2024), Table 1: 32 layers, 8 KV heads, 32k context, 8 experts, top 2
    "mixtral-8x7b": {"num_hidden_layers": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
                     "num_local_experts": 8, "num_experts_per_tok": 2},
    # Gemma 2 report (2024), Table 1: 26 / 42 / 46 layers, 8k context, local window 4096
    "gemma-2-2b": {"num_hidden_layers": 26, "max_position_embeddings": 8192, "sliding_window": 4096},
    "gemma-2-9b": {"num_hidden_layers": 42, "max_position_embeddings": 8192, "sliding_window": 4096},
    "gemma-2-27b": {"num_hidden_layers": 46, "max_position_embeddings": 8192, "sliding_window": 4096},
    # DeepSeek-V3 technical report, section 4.2: 61 layers, 128 heads, d_c = 512, rope head dim 64, 256 experts
    "deepseek-v3": {"num_hidden_layers": 61, "num_attention_heads": 128, "kv_lora_rank": 512,
                    "qk_rope_head_dim": 64, "n_routed_experts": 256},
    # Qwen3 technical report, Tables 1 and 2
    "qwen3-8b": {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8},
    "qwen3-235b-a22b": {"num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
                        "num_experts": 128, "num_experts_per_tok": 8},
    # gpt-oss model card (OpenAI 2025): 36 / 24 layers, 64 query and 8 KV heads, banded window of 128 tokens
    "gpt-oss-120b": {"num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
                     "sliding_window": 128},
    "gpt-oss-20b": {"num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
                    "sliding_window": 128},
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_configs_say_what_their_makers_published(name):
    entry = catalog.find(name)
    config = json.loads(entry.path.read_text())
    config = config.get("text_config", config)
    assert {field: config.get(field) for field in PUBLISHED[name]} == PUBLISHED[name]


def test_llama_2_13b_and_70b_run_to_4096_tokens():
    assert load_model("llama-2-13b").max_position_embeddings == 4096
    assert load_model("llama-2-70b").max_position_embeddings == 4096


def test_every_entry_names_its_model_and_where_its_copy_came_from():
    for entry in catalog.entries():
        assert entry.hf_id.count("/") == 1 and entry.source.strip() and entry.path.is_file(), entry.name
