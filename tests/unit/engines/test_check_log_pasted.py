"""check-log on logs as users paste them (issue 55 item 4): per-rank prefixes of Ray and vLLM's processes with the
ranks interleaved, journald, docker compose, colour codes with and without their escape byte, Windows line ends
(the dev logs of tests/data/logs/pasted/, built from the engines' line formats: README there); vLLM's refusal
hard-wrapped or cut mid-sentence; the one-line memory split of vLLM and vllm-ascend; TGI's argument block with no
KV line. Expected figures are worked out here from the lines themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget import load_model
from kvbudget.checklog import check_log, check_log_without_model
from kvbudget.cli import main
from kvbudget.commands.checklog import read_log
from kvbudget.errors import KVBudgetError

PASTED = Path(__file__).parents[2] / "data" / "logs" / "pasted"
WHY = "the log names no model path"
GIB = 2**30


def rows(text: str) -> dict[str, tuple[str, str, bool | None]]:
    return {r.quantity: (r.logged, r.predicted, r.matches) for r in check_log_without_model(text, WHY).rows}


@pytest.mark.parametrize("name, ranks, smallest", [
    ("ray-tp4-two-nodes.log", 4, "30.17"),  # 2 on the head node, 1 on the other and 1 more Ray deduplicated
    ("multiproc-tp4-interleaved.log", 4, "40.55"),  # Worker_TP0-3, out of order among other lines
    ("vllmworker-rank-tp2.log", 2, "43.74"),  # (VllmWorker rank=N pid=..), coloured
    ("journald-tp2.log", 2, "21.35"),  # journald before vLLM's own prefix
    ("compose-ansi-tp2.log", 2, "18.92"),  # compose, colour codes with and without their escape byte
    ("crlf-worker-tp2.log", 2, "9.80"),  # Windows line ends
    ("docker-timestamps-tp4.log", 4, "22.58"),  # docker logs -t: no line is taken for the folded tail of another
    ("kubectl-prefix-tp2.log", 2, "61.18"),  # kubectl logs --prefix
])
def test_every_rank_of_a_pasted_log_is_counted(name, ranks, smallest):
    """vLLM sizes every rank's cache to the smallest rank's: each rank's budget line counts once, whatever was
    written before it, and the smallest is the budget."""
    texts = [read_log(str(PASTED / name)), (PASTED / name).read_bytes().decode()]  # as read, and the raw \r\n
    for text in texts:
        budget = check_log_without_model(text, WHY).rows[0]
        assert budget.quantity == "KV budget" and budget.logged == f"{smallest} GiB"
        assert f"the smallest of {ranks} ranks'" in budget.note


def test_the_pasted_dev_logs_are_all_listed():
    readme = (PASTED / "README.md").read_text()
    assert all(f"`{p.name}`" in readme for p in PASTED.glob("*.log"))


# Llama-3.1-8B keeps 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072 B a token: 131,072 tokens take
# exactly 16 GiB, 32,768 tokens 4 GiB.
def test_a_hard_wrapped_refusal_cut_mid_word_is_read():
    text = read_log(str(PASTED / "refusal-hard-wrapped-cut.log"))
    assert rows(text)["refused: KV cache needed"] == ("16.00 GiB", "more than the 4.21 GiB available", True)
    check = {r.quantity: r for r in check_log(text, load_model("llama-3.1-8b")).rows}
    assert check["KV budget"].logged == "4.21 GiB" and check["refused: KV cache needed"].predicted == "16.00 GiB"
    assert check["refused: KV cache needed"].matches and check["refused: fits"].matches


def test_a_refusal_at_the_end_of_its_tracebacks_is_read_once():
    """vLLM prints the refusal in the engine's traceback and again in the process's: one refusal. 4.00 GiB hold
    2,048 blocks of 16 tokens x 131,072 B (2 MiB); less the null block, 2,047 x 16 = 32,752 tokens."""
    check = {r.quantity: r for r in check_log(read_log(str(PASTED / "refusal-traceback-twice.log")),
                                              load_model("llama-3.1-8b")).rows}
    assert check["KV budget"].logged == "4.00 GiB" and "ranks" not in check["KV budget"].note
    longest = check["estimated maximum model length"]
    assert longest.logged == "32,752" and longest.matches
    assert check["refused: KV cache needed"].matches and check["refused: fits"].matches


@pytest.mark.parametrize("cut", [
    "  ValueError: To serve at least one request with the model's max seq len (32768),\n  4.00 GiB KV cache is "
    "needed, which is larger t",  # the stored excerpt of vllm#53961's shape: indented, wrapped, cut
    "ValueError: To serve at least one request with the models's max seq len (32768), (4.00 GiB KV cache is need",
    "model's max seq len (32768), (4.00 GiB KV cache is needed, which",  # the paste's first line lost
])
def test_a_refusal_cut_before_its_memory_checks_what_one_request_needs(cut):
    """No budget survives the cut: the memory one request of max seq len needs is still the plan's to check."""
    check = check_log(cut, load_model("llama-3.1-8b"))
    assert [(r.quantity, r.logged, r.predicted, r.matches) for r in check.rows] == [
        ("refused: KV cache needed", "4.00 GiB", "4.00 GiB", True)]
    assert check.settings["max_model_len"] == 32768 and "cut before" in check.assumed["KV budget"]
    assert rows(cut)["refused: max seq len"] == ("32,768", "-", None)


def test_a_refusal_cut_before_anything_to_check_says_what_it_read(tmp_path, capsys):
    log = tmp_path / "cut.log"
    log.write_text("ERROR ValueError: To serve at least one request with the model's max seq len (32768),")
    assert main(["check-log", str(log), "--model", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "states no KV budget" in err and "a refusal's max seq len" in err


def test_a_hybrids_refusal_for_want_of_state_blocks_is_read():
    found = rows("ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (421). Each decode sequence "
                 "requires one Mamba cache block, so CUDA graph capture cannot proceed.")
    assert found["refused: Mamba cache blocks"] == ("421", "fewer than max_num_seqs 1,024", True)


@pytest.mark.parametrize("device", ["GPU", "TPU", "HPU", "hpu"])  # tpu_executor.py, Gaudi's habana_executor.py
def test_v0s_blocks_line_of_any_device_shows_what_it_read(device):
    found = rows(f"INFO 08-02 17:37:54 executor.py:85] # {device} blocks: 1519, # CPU blocks: 256")
    assert found[f"{device.upper()} blocks"][0] == "1,519" and found["CPU blocks (swap space)"][0] == "256"


def test_a_log_with_nothing_to_show_without_its_model_is_one_line(tmp_path, capsys):
    """A vLLM log whose only line is its banner checks nothing without the model: no empty partial check, the line
    naming the --model to pass."""
    log = tmp_path / "banner.log"
    log.write_text("INFO 12-05 12:00:20 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='/x'\n")
    assert main(["check-log", str(log), "--json"]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "nothing to check without it" in err and "--model" in err


def test_vllms_short_tensor_parallel_flag_is_read():
    check = check_log("vllm serve meta-llama/Llama-3.1-8B -tp 2 --max-model-len 32768\nValueError: To serve at "
                      "least one request with the model's max seq len (32768), (2.00 GiB KV cache is needed",
                      load_model("llama-3.1-8b"))
    assert check.settings["tp"] == 2 and check.rows[0].predicted == "2.00 GiB"  # 4 GiB over 2 ranks


# The one-line split, as vLLM 0.11 on prints it: 80 GiB x 0.9 = 72 GiB asked; the terms 15 + 2 + 0.5 + 0.5 = 18 GiB;
# the suggestions 72 - 18 GiB - 150 MiB = 57,824,772,096 B and 79.5 - 18 GiB - 150 MiB = 65,877,835,776 B.
SPLIT = ("(Worker_TP0 pid=7) INFO 12-05 12:02:00 [gpu_worker.py:391] Free memory on device (79.5/80.0 GiB) on startup. "
         "Desired GPU memory utilization is (0.9, 72.0 GiB). Actual usage is 15.0 GiB for weight, 2.0 GiB for peak "
         "activation, 0.5 GiB for non-torch memory, and 0.5 GiB for CUDAGraph memory. Replace gpu_memory_utilization "
         "config with `--kv-cache-memory={fit}` ({fit_gib} GiB) to fit into requested memory, or "
         "`--kv-cache-memory=65877835776` (61.35 GiB) to fully utilize gpu memory. Current kv cache memory in use is "
         "53.85 GiB.")


def test_the_one_line_split_is_checked_without_the_model():
    found = rows(SPLIT.format(fit=57824772096, fit_gib="53.85"))
    assert found["KV budget"][0] == "53.85 GiB"
    assert found["memory: the engine's share"][2] is True
    assert found["memory: weight"] == ("15.00 GiB", "-", None) and found["memory: CUDAGraph memory"][0] == "0.50 GiB"
    assert found["memory: suggested --kv-cache-memory"] == ("53.85 GiB", "53.85", True)
    assert found["memory: free memory less the share"] == ("7.50 GiB", "7.50", True)  # 79.5 - 72
    off = rows(SPLIT.format(fit=57824772096 + GIB, fit_gib="54.85"))  # a GiB more than the terms leave: shown
    assert off["memory: suggested --kv-cache-memory"][2] is None
    # the later form: the weights and non-torch memory as one term (15.5 GiB), the same sum
    consumed = SPLIT.format(fit=57824772096, fit_gib="53.85").replace(
        "15.0 GiB for weight, 2.0 GiB for peak activation, 0.5 GiB for non-torch memory, and",
        "15.5 GiB for consumed memory (weights + non-torch), 2.0 GiB for peak activation, and")
    assert rows(consumed)["memory: suggested --kv-cache-memory"] == ("53.85 GiB", "53.85", True)


def test_vllm_ascends_split_and_the_refusal_for_want_of_free_memory():
    ascend = ("Free memory on device (60.0/64.0 GiB) on startup. Desired GPU memory utilization is (0.9, 57.6 GiB). "
              "Actual usage: 10.0 GiB for weights, 1.0 GiB for peak activation, 0.5 GiB for non-torch memory, 0.1 GiB "
              "for NPU graph memory. Replace gpu_memory_utilization with `--kv-cache-memory=49234837504` (45.85 GiB) "
              "to fit into requested memory, or `--kv-cache-memory=51811817882` (48.25 GiB) to fully utilize NPU free "
              "memory. Current KV cache memory: 45.8 GiB.")  # 57.6 - 11.6 GiB - 150 MiB; 60.0 - 11.6 GiB - 150 MiB
    found = rows(ascend)
    assert found["KV budget"][0] == "45.8 GiB" and found["memory: NPU graph memory"][0] == "0.10 GiB"
    assert found["memory: suggested --kv-cache-memory"][2] is True
    assert found["memory: free memory less the share"][2] is True  # 48.25 - 45.85 = 2.40 = 60.0 - 57.6
    with pytest.raises(KVBudgetError, match="understood: the memory split"):  # the full check needs its budget line
        check_log(ascend.split(" Current KV")[0], load_model("llama-3.1-8b"), {"max_model_len": 4096})
    refused = rows("ValueError: Free memory on device (60.2/79.19 GiB) on startup is less than desired GPU memory "
                   "utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
                   "processes.")
    assert refused["refused: free memory below the share"][2] is True
    assert refused["memory: the engine's share"][2] is True  # 79.19 x 0.9 = 71.271


TGI_ARGS = ("2025-03-17T07:49:06.934488Z  INFO text_generation_launcher: Args {{\n    model_id: \"/models\",\n"
            "    max_input_tokens: {input},\n    max_total_tokens: {total},\n    max_batch_prefill_tokens: None,\n"
            "    max_batch_total_tokens: None,\n    max_waiting_tokens: 20,\n")


def test_a_tgi_argument_block_with_no_kv_line_checks_its_limits():
    check = check_log(TGI_ARGS.format(input="Some(32000)", total="Some(32768)"), load_model("llama-3.1-8b"))
    found = {r.quantity: (r.logged, r.predicted, r.matches) for r in check.rows}
    assert found["max input tokens < max total tokens"] == ("32,000 / 32,768", "holds", True)
    assert found["max total tokens within the model's context"] == ("32,768", "<= 131,072", True)
    assert "KV pool" in check.assumed
    beyond = check_log(TGI_ARGS.format(input="Some(200000)", total="Some(200001)"), load_model("llama-3.1-8b"))
    assert [r.matches for r in beyond.rows if "context" in r.quantity] == [None]  # shown: rope scaling may allow it
    broken = rows(TGI_ARGS.format(input="Some(4096)", total="Some(4096)"))
    assert broken["max input tokens < max total tokens"] == ("4,096 / 4,096", "broken", None)


def test_tgis_router_line_alone_is_read():
    text = "2025-03-17T07:50:12.104571Z  INFO text_generation_router_v3: backends/v3/src/lib.rs:137: Setting max " \
           "batch total tokens to 123449"
    assert rows(text)["max batch total tokens"] == ("123,449", "-", None)
    # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072 B a token; x 123,449 = 15.07 GiB
    assert check_log(text, load_model("llama-3.1-8b")).rows[-1].predicted == "15.07 GiB"


def test_a_tgi_argument_block_stating_nothing_says_so_in_one_line(tmp_path, capsys):
    log = tmp_path / "tgi.log"
    log.write_text(TGI_ARGS.format(input="None", total="None"))
    assert main(["check-log", str(log), "--model", "llama-3.1-8b", "--json"]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "nothing to check" in err and "--max-total-tokens" in err
    with pytest.raises(KVBudgetError, match="nothing to check"):
        check_log_without_model(TGI_ARGS.format(input="None", total="None"), WHY)
    log.write_text(TGI_ARGS.format(input="None", total="Some(8192)"))  # a limit, but nothing the model checks
    assert main(["check-log", str(log), "--json"]) == 2 and json.loads(capsys.readouterr()[0])["partial"]


_PARTS = [SPLIT.format(fit=57824772096, fit_gib="53.85"), TGI_ARGS.format(input="Some(9)", total="Some(8)"),
          "To serve at least one request with the model's max seq len (", "99999999999999) , (1.2.3 GiB KV cache",
          " is need", "than the available KV cache memory (", "Free memory on device (1/2 GiB) on startup is less than "
          "desired GPU memory utilization (9, 9 GiB)", "max_num_seqs (5) exceeds available Mamba cache blocks (9)",
          "# HPU blocks: 0", "Actual usage: 1.0 GiB for weights", "`--kv-cache-memory=1` to fit", "\r\n", "\n", " ",
          "&#10;", "\xa0", "(1048576),\n  23.32 GiB KV cache is needed, which is larger t"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_PARTS) | st.text(max_size=40), max_size=12))
def test_any_mix_of_the_new_lines_is_read_or_refused_in_one_line(parts):
    """Whatever of these lines a paste mixes, cut or repeats, the readers answer or refuse with check-log's own
    error, with and without the model."""
    text = "".join(parts)
    for run in (lambda: check_log_without_model(text, WHY), lambda: check_log(text, load_model("llama-3.1-8b"))):
        try:
            run()
        except KVBudgetError as exc:
            assert "\n" not in str(exc)
