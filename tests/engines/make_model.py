"""Writes a tiny random-weight model folder (config, safetensors, tokenizer with a chat template).

Run with the engine's own Python so that its transformers reads what this writes:
    python make_model.py '<config json>' OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def main(cfg: dict, out: str) -> None:
    cfg = dict(cfg)
    if cfg.pop("_config_only", False):  # the config.json as given, for an engine that makes its own (dummy) weights
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "config.json").write_text(json.dumps(cfg, indent=1))
    else:
        model_type = cfg.pop("model_type")
        dtype = cfg.pop("torch_dtype", "bfloat16")
        config = transformers.CONFIG_MAPPING[model_type](**cfg)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        model.save_pretrained(out)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(cfg.get("vocab_size", 512), 320) - 3,
                                  special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog, hello world"] * 64, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
