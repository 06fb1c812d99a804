"""check-log on vLLM logs that state no KV budget, only a count of what the cache held (V0's refusal, the GPU
blocks, a token count to 0.19) or that no block fit: with the model, a verdict (the memory the count takes, the
plan's count in it, whether max_model_len fits); without it, the one line naming the --model. Expected figures are
worked out here from the models' shapes (bytes a token = 2 (K and V) x layers x KV heads / tp x head size x 2)."""

from __future__ import annotations

import contextlib
import io
import json

from kvbudget.cli import main

V0_REFUSAL = ("vllm-1  | ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that "
              "can be stored in KV cache (16832). Try increasing `gpu_memory_utilization` or decreasing "
              "`max_model_len` when initializing the engine.\n")
NO_MEMORY = ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
             "initializing the engine.\n")


def run(tmp_path, text: str, *args: str) -> tuple[int, dict, str]:
    log = tmp_path / "start.log"
    log.write_text(text)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["check-log", str(log), "--json", *args])
    return status, json.loads(out.getvalue()) if out.getvalue().startswith("{") else {}, err.getvalue()


def rows(answer: dict) -> dict[str, tuple[str, str, bool | None]]:
    return {r["quantity"]: (r["logged"], r["predicted"], r["matches"]) for r in answer["rows"]}


def test_v0_refusal_without_a_budget_is_a_verdict(tmp_path):
    # Mistral-7B: 32 layers x 8 KV heads x 128 x 2 x 2 B = 128 KiB a token, 2 MiB a 16-token block; 16,832 tokens
    # are 1,052 blocks = 2,104 MiB, and a request of 32,768 tokens does not fit in them
    status, answer, err = run(tmp_path, V0_REFUSAL, "--model", "mistral-7b")
    assert status == 0, err
    found = rows(answer)
    assert found["refused: tokens"] == ("16,832", "16,832", True)
    assert found["KV memory the count takes"][1] == "2.05 GiB"  # 2,104 MiB
    assert found["refused: fits"] == ("no", "no", True)
    assert not answer["partial"]


def test_the_tensor_parallel_flag_with_underscores_is_read(tmp_path):
    # Qwen2.5-14B at TP 2: 48 layers x (8 / 2) KV heads x 128 x 2 x 2 B = 96 KiB a token per GPU; 81,536 tokens
    # are 5,096 blocks of 1.5 MiB = 7,644 MiB per GPU
    text = ("vllm serve --trust-remote-code --tensor_parallel_size 2 --gpu_memory_utilization=0.98 /root/Qwen-14B\n"
            "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be "
            "stored in KV cache (81536). Try increasing `gpu_memory_utilization`.\n")
    status, answer, err = run(tmp_path, text, "--model", "qwen2.5-14b")
    assert status == 0, err
    assert answer["settings"]["tp"] == 2
    assert rows(answer)["KV memory the count takes"][1] == "7.46 GiB"  # 7,644 / 1,024


def test_gpu_blocks_alone_are_checked_in_the_memory_they_take(tmp_path):
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 x 2 B = 128 KiB a token, 2 MiB a block; 1,381 blocks are
    # 2,762 MiB and hold 22,096 tokens: 2.70 requests of 8,192
    status, answer, err = run(tmp_path, "INFO 01-30 03:19:14 kv_cache_utils.py:395] # GPU blocks: 1381\n",
                              "--model", "llama-3.1-8b", "--max-model-len", "8192", "--engine-version", "0.7.0")
    assert status == 0, err
    found = rows(answer)
    assert found["blocks"] == ("1,381", "1,381", True)
    assert found["KV memory the count takes"][1] == "2.70 GiB"  # 2,762 / 1,024
    assert found["max concurrency at 8,192 tokens"][1] == "2.70x"


def test_a_token_count_to_0_19_alone_is_checked(tmp_path):
    # 32,768 tokens of Llama-3.1-8B are 2,048 blocks of 2 MiB: 4 GiB
    status, answer, err = run(tmp_path, "INFO [kv_cache_utils.py:1305] GPU KV cache size: 32,768 tokens\n",
                              "--model", "llama-3.1-8b", "--max-model-len", "4096", "--engine-version", "0.11.0")
    assert status == 0, err
    found = rows(answer)
    assert found["KV cache size (tokens)"] == ("32,768", "32,768", True)
    assert found["KV memory the count takes"][1] == "4.00 GiB"


def test_no_memory_for_a_block_is_the_plans_refusal_too(tmp_path):
    status, answer, err = run(tmp_path, NO_MEMORY, "--model", "llama-3.1-8b")
    assert status == 0, err
    found = rows(answer)
    assert found["refused: no cache block"][1] == "under 2.00 MiB per GPU"  # one 16-token block of every layer
    assert found["refused: fits"] == ("no", "no", True)
    status, _, err = run(tmp_path, "INFO # GPU blocks: 0, # CPU blocks: 256\n" + NO_MEMORY, "--model", "llama-2-7b",
                         "--max-model-len", "4096")
    assert status in (0, 1), err  # V0's zero blocks: a verdict, whichever it is


def test_without_the_model_one_line_names_it(tmp_path):
    for text in (V0_REFUSAL, NO_MEMORY):
        status, answer, err = run(tmp_path, text)
        assert status == 2 and answer["partial"]
        assert err.count("\n") == 1 and "--model" in err and "for the rows that need the model" in err


def test_sglang_pool_count_alone_shows_the_memory_it_takes(tmp_path):
    # SGLang's buffers keep one row more than the pool: (300,288 + 1) x 128 KiB of Llama-3.1-8B = 36.66 GiB
    line = ("[2026-01-31 13:51:02] max_total_num_tokens=300288, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            "max_running_requests=33, context_len=32768, available_gpu_mem=17.22 GB\n")
    status, answer, err = run(tmp_path, line, "--model", "llama-3.1-8b")
    assert status == 0, err
    found = rows(answer)
    assert found["pool (tokens)"][0] == "300,288"
    assert found["KV memory per rank"][1:] == ("36.66 GiB", None)


def test_a_token_count_and_concurrency_that_agree_under_no_era_is_a_verdict(tmp_path):
    # 100,000 tokens of Llama-3.1-8B are 6,250 blocks of 16 under either era's meaning: 6,250 x 16 / 32,768 = 3.05
    # requests, not the 3.00x printed; without a version the rows differ rather than the log being refused
    text = ("INFO [kv_cache_utils.py] GPU KV cache size: 100,000 tokens\n"
            "INFO [kv_cache_utils.py] Maximum concurrency for 32,768 tokens per request: 3.00x\n")
    status, answer, err = run(tmp_path, text, "--model", "llama-3.1-8b")
    assert status == 1, err
    assert rows(answer)["max concurrency at 32,768 tokens"][:2] == ("3.00x", "3.05x")
    assert "neither era" in answer["assumed"]["engine_version"]
