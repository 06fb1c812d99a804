"""How many multi-token-prediction (MTP) layers a model has, for the families whose MTP layers serving engines draft
with (speculative method "mtp"): read from the config field each family names them by, as vLLM 0.32's MTP models
read it (vllm/config/speculative.py hf_config_override maps each family to its MTP model; the file is named
beside each), with their default where the published config leaves the field out."""

from __future__ import annotations

from typing import Any

# model_type: the config field that counts the layers, and how many vLLM's MTP model builds where the config leaves
# the field out (its own getattr default; None: read as 0, no MTP layers)
_MTP_LAYERS: dict[str, tuple[str, int | None]] = {
    "deepseek_v3": ("num_nextn_predict_layers", None),  # deepseek_mtp.py (DeepSeekMTP)
    "deepseek_v32": ("num_nextn_predict_layers", None),  # deepseek_mtp.py (DeepseekV32MTPModel)
    "glm4_moe": ("num_nextn_predict_layers", None),  # glm4_moe_mtp.py (Glm4MoeMTP)
    # qwen3_next_mtp.py: getattr(config, "num_nextn_predict_layers", 1); Qwen3-Next's published config.json has no
    # such field and its checkpoint holds one MTP layer (mtp.layers.0.*)
    "qwen3_next": ("num_nextn_predict_layers", 1),
    "qwen3_5_text": ("mtp_num_hidden_layers", 1),  # qwen3_5_mtp.py: getattr(config, "mtp_num_hidden_layers", 1)
    "qwen3_5_moe_text": ("mtp_num_hidden_layers", 1),
}


def mtp_layer_count(model_type: str, cfg: dict[str, Any]) -> int:
    """The MTP layers vLLM builds for the (text) config `cfg` of `model_type`: 0 for a family it has no MTP drafter
    for (MiniMax-M2's num_mtp_modules, Kimi-K2's num_nextn_predict_layers are read by none of vLLM 0.32's)."""
    field, absent = _MTP_LAYERS.get(model_type, ("", None))
    if not field:
        return 0
    count = cfg.get(field)  # a whole number from 0 (limits.check_fields)
    return (absent or 0) if count is None else int(count)
