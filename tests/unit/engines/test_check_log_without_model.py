"""check-log on the lines issue 55 listed as refused, each engine's rows that need no model, and the one line
naming the --model to give. Expected figures are worked out here from the lines themselves."""

from __future__ import annotations

import json

import pytest

from kvbudget import load_model
from kvbudget.checklog import check_log, check_log_without_model, missing_model
from kvbudget.cli import main
from kvbudget.errors import KVBudgetError

WHY = "the log names no model path"


def rows(text: str) -> dict[str, tuple[str, str, bool | None]]:
    return {r.quantity: (r.logged, r.predicted, r.matches) for r in check_log_without_model(text, WHY).rows}


@pytest.mark.parametrize("line, budget", [
    ("INFO 12-11 23:12:57 worker.py:217] kv_cache_size          12.77GiB", "12.77"),  # V0 0.6.5's table
    ("INFO 01-16 09:40:00 worker.py:238] model weights take 19.86GiB; non_torch_memory takes 0.16GiB; PyTorch "
     "activation peak memory takes 36.63GiB; the rest of the memory reserved for KV Cache is 14.65GiB.", "14.65"),
    ("(EngineCore pid=83) INFO 07-26 12:29:34 [gpu_worker.py:479] Initial free memory 93.88 GiB, reserved 49.0 GiB "
     "memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling.", "49.0"),
    ("(Worker_TP0 pid=770) INFO 08-21 18:22:06 [gpu_worker.py:789] Free memory on device (94.05/95.01 GiB) on "
     "startup. Desired GPU memory utilization is (0.9, 85.51 GiB). Actual usage is 56.89 GiB for consumed memory "
     "(weights + non-torch). Current kv cache memory in use is 27.85 GiB.", "27.85"),
    ("INFO 09-23 18:12:39 [gpu_worker.py:298] Current kv cache memory in use is 59212694937 bytes.",
     f"{59212694937 / 2**30:.6f}"),
])
def test_every_eras_vllm_budget_line_is_read(line, budget):
    assert rows(line)["KV budget"][0] == f"{budget} GiB"


def test_vllm_memory_share_and_concurrency_checked_without_the_model():
    found = rows("Free memory on device (94.05/95.01 GiB) on startup. Desired GPU memory utilization is (0.9, "
                 "85.51 GiB).\nINFO # CUDA blocks: 6001, # CPU blocks: 1638\n"
                 "INFO Maximum concurrency for 65,536 tokens per request: 1.47x")
    assert found["memory: the engine's share"][2] is True  # 95.01 x 0.9 = 85.509
    assert found["max concurrency at 65,536 tokens"][1:] == ("1.47", True)  # 6001 x 16 / 65536 = 1.465
    shown = rows("INFO Maximum concurrency for 32,768 tokens per request: 33.04x\n"
                 "INFO GPU KV cache size: 290,864 tokens")  # a hybrid's count to 0.19: not this model-free ratio
    assert shown["max concurrency at 32,768 tokens"][2] is None


def test_sglang_ranks_and_scheduler_line():
    text = ("[2026-01-31 13:50:39 TP1] KV Cache is allocated. #tokens: 300288, K size: 8.38 GB, V size: 5.59 GB\n"
            "[2026-01-31 13:50:39 TP2] KV Cache is allocated. #tokens: 300288, K size: 8.38 GB, V size: 5.59 GB\n"
            "[2026-01-31 13:51:02] max_total_num_tokens=300288, chunked_prefill_size=8192, max_prefill_tokens=16384")
    found = rows(text)
    assert found["pool (tokens)"] == ("300,288", "-", True)
    assert found["max_total_num_tokens"][2] is True
    alone = rows("[2026-06-28 15:16:45] max_total_num_tokens=2086558, chunked_prefill_size=8192, max_running_"
                 "requests=33, context_len=256000, available_gpu_mem=17.22 GB")
    assert alone["max_total_num_tokens"] == ("2,086,558", "-", None)


def test_llamacpp_sizes_against_their_parts():
    text = ("llama_kv_cache_init:      CUDA0 KV buffer size =  1536.00 MiB\n"
            "llama_kv_cache_init:      CUDA1 KV buffer size =  3584.00 MiB\n"
            "llama_new_context_with_model: KV self size  = 5120.00 MiB, K (f16): 2560.00 MiB, V (f16): 2560.00 MiB")
    found = rows(text)
    assert found["KV self size"][2] is True and found["KV self size over the devices"][2] is True
    off = rows(text.replace("3584.00", "3500.00"))
    assert off["KV self size over the devices"][2] is False


def test_llamacpp_2023_kv_self_size_in_mb():
    """2 x 512 cells x 60 layers x 6656 wide x 4 bytes (f32) = 1,635,778,560 B = 1560.00 MiB."""
    shape = (("n_ctx", 512), ("n_layer", 60), ("n_embd", 6656))
    text = "\n".join(f"llama_model_load_internal: {k} = {v}" for k, v in shape)
    text += "\nllama_init_from_file: kv self size  = 1560.00 MB"
    assert rows(text)["kv self size"] == ("1560.00 MB", "1560.00 MiB (f32)", True)


def test_tgi_argument_block_is_read_with_and_without_the_model():
    text = ('2023-08-22T18:35:50Z  INFO text_generation_launcher: Args { model_id: "meta-llama/Llama-2-13b-chat-hf", '
            "num_shard: Some(4), max_input_length: 4096, max_total_tokens: 8192, max_batch_total_tokens: 16000 }")
    assert rows(text)["max batch total tokens"] == ("16,000", "-", None)
    check = check_log(text, load_model("llama-2-13b"))
    # 40 layers x 40 heads / 4 shards x 128 x 2 (K, V) x 2 bytes = 204,800 B a token; x 16,000 = 3.05 GiB
    assert check.settings["num_shard"] == 4 and check.rows[-1].predicted == "3.05 GiB"


def test_the_line_naming_the_model_to_give():
    text = ("(APIServer pid=1) INFO non-default args: {'model': '/data/ckpt/qwen3-14b-awq', "
            "'served_model_name': ['qwen3-14b'], 'max_model_len': 32768}\n"
            "INFO Resolved architecture: Qwen3ForCausalLM\nINFO GPU KV cache size: 42,656 tokens")
    line = missing_model(text, "the log's model cannot be read here")
    assert "served-model-name 'qwen3-14b'" in line and "architecture 'Qwen3ForCausalLM'" in line
    assert "closest: qwen3-14b" in line


def test_no_model_cli_prints_rows_then_one_line(tmp_path, capsys):
    log = tmp_path / "v1.log"
    log.write_text("INFO GPU KV cache size: 2,042,016 tokens\n"
                   "INFO Maximum concurrency for 2,048 tokens per request: 997.08x\n")  # 2,042,016 / 2,048 = 997.078
    assert main(["check-log", str(log), "--json"]) == 2
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["partial"] and [r["matches"] for r in data["rows"]] == [None, True]
    assert err.count("\n") == 1 and "--model" in err and "\x1f" not in err + out
    log.write_text("INFO GPU KV cache size: 2,042,016 tokens\n"
                   "INFO Maximum concurrency for 2,048 tokens per request: 7.08x\n")
    assert main(["check-log", str(log)]) == 2  # a hybrid's or another block size's figures: shown, not failed


def test_a_log_with_no_figure_to_check_says_what_it_lacks():
    with pytest.raises(KVBudgetError, match="states none of max_input_tokens.*nothing to check"):
        check_log_without_model("text_generation_launcher: Args { model_id: None, max_batch_total_tokens: None }"
                                "\nKV-cache blocks: x", WHY)
