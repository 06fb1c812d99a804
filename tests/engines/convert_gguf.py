"""Converts a tiny HF model folder to GGUF with llama.cpp's own convert_hf_to_gguf.py.

Our tiny tokenizers are trained offline, so the converter cannot recognise their pre-tokenizer by hash;
we tell it to treat them as plain GPT-2 byte-level BPE, which is what they are. Everything else is the
converter as users run it.   python convert_gguf.py LLAMA_CPP_DIR MODEL_DIR OUT.gguf
"""

import sys

llama_dir, model_dir, out = sys.argv[1:4]
sys.path.insert(0, llama_dir)
sys.path.insert(1, f"{llama_dir}/gguf-py")

import conversion.base  # noqa: E402

conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"

import convert_hf_to_gguf  # noqa: E402

sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", out, "--outtype", "f32"]
convert_hf_to_gguf.main()
