"""Scaled-down configs that keep each family's cache structure (head counts, head dims, window
pattern, MLA dims, linear layers) small enough to run on a CPU in well under a second."""

from __future__ import annotations

WINDOW = 8  # sliding window / chunk used by the tiny models: contexts are chosen around it

_BASE = dict(hidden_size=64, intermediate_size=64, vocab_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, torch_dtype="bfloat16")

TINY = {
    "llama": dict(_BASE, model_type="llama", head_dim=24),
    "mistral": dict(_BASE, model_type="mistral", sliding_window=WINDOW),
    "mixtral": dict(_BASE, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
    "qwen2": dict(_BASE, model_type="qwen2"),
    "qwen2_sliding": dict(_BASE, model_type="qwen2", use_sliding_window=True, sliding_window=WINDOW,
                          max_window_layers=2),
    "qwen2_moe": dict(_BASE, model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "qwen3": dict(_BASE, model_type="qwen3", head_dim=32),
    "qwen3_moe": dict(_BASE, model_type="qwen3_moe", head_dim=32, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32),
    "qwen3_next": dict(_BASE, model_type="qwen3_next", head_dim=16, linear_num_key_heads=2,
                       linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                       linear_conv_kernel_dim=4, full_attention_interval=2, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "gemma": dict(_BASE, model_type="gemma", head_dim=32, num_key_value_heads=1),
    "gemma2": dict(_BASE, model_type="gemma2", head_dim=32, sliding_window=WINDOW),
    "gemma3_text": dict(_BASE, model_type="gemma3_text", head_dim=32, sliding_window=WINDOW,
                        sliding_window_pattern=3, num_hidden_layers=6),
    "phi3": dict(_BASE, model_type="phi3", sliding_window=WINDOW, pad_token_id=0),
    "deepseek_v2": dict(_BASE, model_type="deepseek_v2", num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None,
                        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, moe_intermediate_size=32,
                        n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, n_group=1,
                        topk_group=1),
    "deepseek_v3": dict(_BASE, model_type="deepseek_v3", num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=24, moe_intermediate_size=32,
                        n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, n_group=1,
                        topk_group=1),
    "gpt_oss": dict(_BASE, model_type="gpt_oss", head_dim=16, sliding_window=WINDOW, num_local_experts=4,
                    num_experts_per_tok=2),
    "llama4_text": dict(_BASE, model_type="llama4_text", head_dim=16, attention_chunk_size=WINDOW,
                        num_local_experts=2, num_experts_per_tok=1, intermediate_size_mlp=64,
                        interleave_moe_layer_step=1, no_rope_layer_interval=2),
    "falcon": dict(_BASE, model_type="falcon", multi_query=True, new_decoder_architecture=False),
    "falcon_new_arch": dict(_BASE, model_type="falcon", new_decoder_architecture=True, num_kv_heads=2),
    "falcon_h1": dict(_BASE, model_type="falcon_h1", num_hidden_layers=2, head_dim=16, mamba_d_ssm=64,
                      mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_d_conv=4,
                      mamba_chunk_size=8),
    "jamba": dict(_BASE, model_type="jamba", num_experts=2, num_experts_per_tok=1, attn_layer_period=2,
                  attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_dt_rank=8,
                  mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, use_mamba_kernels=False),
    "opt": dict(_BASE, model_type="opt", ffn_dim=64, word_embed_proj_dim=64),
    "cohere": dict(_BASE, model_type="cohere"),
}

# 2025-2026 families
_LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
               linear_conv_kernel_dim=4)
TINY.update({
    "qwen3_5_text": dict(_BASE, model_type="qwen3_5_text", head_dim=16, mamba_ssm_dtype="float32",
                         layer_types=["linear_attention", "full_attention"] * 2, **_LINEAR),
    "qwen3_5_moe_text": dict(_BASE, model_type="qwen3_5_moe_text", head_dim=16, full_attention_interval=2,
                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32, **_LINEAR),
    "gemma3n_text": dict(_BASE, model_type="gemma3n_text", head_dim=16, num_hidden_layers=6, sliding_window=WINDOW,
                         num_kv_shared_layers=2, layer_types=["sliding_attention", "sliding_attention",
                                                              "full_attention"] * 2,
                         hidden_size_per_layer_input=8, vocab_size_per_layer_input=128, laurel_rank=4,
                         altup_num_inputs=4, activation_sparsity_pattern=[0.0] * 6),
    # Gemma 4: sliding layers of 2 x 16, global layers of 1 KV head x 32 (attention_k_eq_v), the last two layers
    # sharing (one of each type)
    "gemma4_text": dict(_BASE, model_type="gemma4_text", head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                        attention_k_eq_v=True, num_hidden_layers=6, sliding_window=WINDOW, num_kv_shared_layers=2,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
                        hidden_size_per_layer_input=8, vocab_size_per_layer_input=128),
    "kimi_linear": dict(_BASE, model_type="kimi_linear", num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8,
                        qk_nope_head_dim=16, v_head_dim=16, num_experts=4, num_experts_per_token=2,
                        moe_intermediate_size=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        linear_attn_config={"kda_layers": [1, 2, 4], "full_attn_layers": [3], "num_heads": 4,
                                            "head_dim": 16, "short_conv_kernel_size": 4}),
    "deepseek_v32": dict(TINY["deepseek_v3"], model_type="deepseek_v32", index_head_dim=16, index_n_heads=2,
                         index_topk=4),
    "nemotron_h": dict(_BASE, model_type="nemotron_h", head_dim=16, layers_block_type=["mamba", "attention", "mlp",
                                                                                       "mamba"],
                       ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=8, n_groups=2, conv_kernel=4, expand=2),
    "nemotron_h_pattern": dict(_BASE, model_type="nemotron_h", head_dim=16, hybrid_override_pattern="M*-ME",
                               num_hidden_layers=5, ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=8,
                               n_groups=2, conv_kernel=4, expand=2, n_routed_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=32, moe_shared_expert_intermediate_size=32),
    "granitemoehybrid": dict(_BASE, model_type="granitemoehybrid", layer_types=["mamba", "attention", "mamba",
                                                                                "mamba"],
                             mamba_n_heads=4, mamba_n_groups=1, mamba_d_state=8, mamba_d_head=32, mamba_d_conv=4,
                             mamba_expand=2, num_local_experts=2, num_experts_per_tok=1),
    "minimax_m2": dict(_BASE, model_type="minimax_m2", head_dim=16, num_local_experts=4, num_experts_per_tok=2),
    "glm4_moe": dict(_BASE, model_type="glm4_moe", head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1),
    # DeepSeek-V4: a plain sliding layer, a CSA layer (1 in 4, overlapping, with the indexer), an HCA layer (1 in 8)
    "deepseek_v4": dict(_BASE, model_type="deepseek_v4", num_key_value_heads=1, head_dim=32, qk_rope_head_dim=8,
                        q_lora_rank=32, o_groups=2, o_lora_rank=16, n_routed_experts=4, n_shared_experts=1,
                        num_experts_per_tok=2, moe_intermediate_size=32, sliding_window=WINDOW, index_n_heads=2,
                        index_head_dim=16, index_topk=4, num_nextn_predict_layers=0, hc_mult=2,
                        layer_types=["sliding_attention", "compressed_sparse_attention",
                                     "heavily_compressed_attention", "compressed_sparse_attention"],
                        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}),
})
# DeepSeek's own form of the plan, as the released configs give it: a compress ratio per layer, the MTP layer's last
TINY["deepseek_v4_ratios"] = {k: v for k, v in TINY["deepseek_v4"].items() if k not in ("layer_types",
                                                                                        "compress_rates")}
TINY["deepseek_v4_ratios"]["compress_ratios"] = [0, 4, 128, 4, 0]

# kimi_k2 is DeepSeek-V3's architecture under its own model_type (transformers runs it as deepseek_v3).
TINY["kimi_k2"] = dict(TINY["deepseek_v3"], model_type="kimi_k2")

# chatglm is remote code; transformers' own `glm` family is the same attention under standard names.
CHATGLM = dict(model_type="chatglm", num_layers=4, num_attention_heads=4, multi_query_attention=True,
               multi_query_group_num=2, kv_channels=16, hidden_size=64, ffn_hidden_size=64,
               padded_vocab_size=128, seq_length=256, torch_dtype="bfloat16")
CHATGLM_AS_GLM = dict(_BASE, model_type="glm", num_key_value_heads=2, head_dim=16, pad_token_id=0)

# What transformers builds each tiny config as.
TRANSFORMERS_TYPE = {"kimi_k2": "deepseek_v3", "qwen2_sliding": "qwen2", "falcon_new_arch": "falcon",
                     "nemotron_h_pattern": "nemotron_h", "deepseek_v4_ratios": "deepseek_v4"}
