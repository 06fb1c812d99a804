"""Speculative decoding on each engine's command line (`PoolPlan.speculative`): the flags written as the engines'
source spells them (vLLM's SpeculativeConfig fields in vllm/config/speculative.py and --speculative-config in every
release's flag list; SGLang 0.5.3's server_args.py; common/arg.cpp and common/speculative.cpp of the llama.cpp that
llama-cpp-python 0.3.36 vendors), and a method a release cannot take refused in one line."""

from __future__ import annotations

import json

import pytest

import kvbudget
from kvbudget.deployment import Deployment, PoolPlan
from kvbudget.engines import get_engine
from kvbudget.engines.llamacpp.launch import FLAGS as LLAMA_FLAGS
from kvbudget.engines.sglang.launch import FLAGS as SGLANG_FLAGS
from kvbudget.engines.vllm.launch import flag_data
from kvbudget.errors import KVBudgetError
from kvbudget.speculative import SpecMethod, Speculative

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "meta-llama/Llama-3.2-1B-Instruct"


def spec(method: SpecMethod, k: int, draft: str | None = None) -> Speculative:
    return Speculative(method=method, num_tokens=k, draft=kvbudget.load_model("llama-3.2-1b") if draft else None,
                       draft_id=draft)


def argv(engine: str, s: Speculative | None, release: str | None = None, tp: int = 1) -> tuple[str, ...]:
    p = PoolPlan(gpu="H100-80GB", tp=tp, max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=8192,
                 gpu_memory_utilization=0.9, speculative=s)
    return get_engine(engine).command(p, Deployment(model=MODEL, engine=engine, release=release, pools=(p,))).argv


def after(args: tuple[str, ...], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize(("method", "draft", "expected"), [
    # SpeculativeMethod in vllm 0.32's config/speculative.py: "draft_model" (underscore), "eagle3", "ngram", "mtp"
    (SpecMethod.DRAFT_MODEL, DRAFT, {"method": "draft_model", "num_speculative_tokens": 3, "model": DRAFT}),
    (SpecMethod.EAGLE3, DRAFT, {"method": "eagle3", "num_speculative_tokens": 3, "model": DRAFT}),
    (SpecMethod.NGRAM, None, {"method": "ngram", "num_speculative_tokens": 3}),
    (SpecMethod.MTP, None, {"method": "mtp", "num_speculative_tokens": 3}),
])
def test_vllm_032_writes_the_speculative_config(method, draft, expected):
    args = argv("vllm", spec(method, 3, draft), "0.32")
    assert json.loads(after(args, "--speculative-config")) == expected
    assert "--speculative-config" in flag_data()["releases"]["0.32.0"]["flags"]


def test_vllm_without_speculation_writes_no_config():
    assert "--speculative-config" not in argv("vllm", None)


def test_vllm_mtp_from_020_and_other_methods_only_at_032():
    # "mtp" is among MTPModelTypes in 0.18.1's and 0.28.0's config/speculative.py; kvbudget sizes mtp from 0.20
    args = argv("vllm", spec(SpecMethod.MTP, 2), "0.28")
    assert json.loads(after(args, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 2}
    assert "--speculative-config" in flag_data()["releases"]["0.28.0"]["flags"]
    for release, method, draft in (("0.28", SpecMethod.EAGLE3, DRAFT), ("0.14", SpecMethod.MTP, None)):
        with pytest.raises(KVBudgetError) as exc:
            argv("vllm", spec(method, 2, draft), release)
        assert exc.value.param == "speculative" and "\n" not in str(exc.value)
        assert f"vLLM {release}" in str(exc.value)


def test_dynamo_and_kserve_keep_the_speculative_config():
    p = PoolPlan(gpu="H100-80GB", max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=8192,
                 gpu_memory_utilization=0.9, speculative=spec(SpecMethod.MTP, 4))  # (Dynamo 1.3 bundles vLLM 0.24)
    d = Deployment(model=MODEL, engine="vllm", pools=(p,))
    from kvbudget.engines.vllm.launch import dynamo_worker, kserve_args

    for launch in (dynamo_worker(p, d), kserve_args(p, d)):
        assert json.loads(after(launch.argv, "--speculative-config"))["num_speculative_tokens"] == 4


@pytest.mark.parametrize(("method", "draft", "algorithm"), [
    (SpecMethod.EAGLE, DRAFT, "EAGLE"), (SpecMethod.EAGLE3, DRAFT, "EAGLE3"),
    (SpecMethod.DRAFT_MODEL, DRAFT, "STANDALONE"), (SpecMethod.MTP, None, "NEXTN"),
])
def test_sglang_053_writes_a_chain_of_k_steps(method, draft, algorithm):
    # server_args.py 0.5.3: --speculative-algorithm choices EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM; a chain of K
    # steps at top-k 1 verifies K + 1 tokens (--speculative-num-draft-tokens)
    args = argv("sglang", spec(method, 3, draft), "0.5.3")
    tail = args[args.index("--speculative-algorithm"):]
    assert tail[:8] == ("--speculative-algorithm", algorithm, "--speculative-num-steps", "3",
                        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
    assert ("--speculative-draft-model-path" in args) == (draft is not None)
    if draft:
        assert after(args, "--speculative-draft-model-path") == DRAFT
    assert [a for a in args if a.startswith("--") and a not in SGLANG_FLAGS[(0, 5, 3)]] == []


def test_sglang_ngram_drafts_k_plus_one_as_a_chain():
    args = argv("sglang", spec(SpecMethod.NGRAM, 5), "0.5.3")
    assert after(args, "--speculative-algorithm") == "NGRAM"
    assert after(args, "--speculative-num-draft-tokens") == "6"
    assert after(args, "--speculative-ngram-max-bfs-breadth") == "1"
    assert "--speculative-num-steps" not in args and "--speculative-draft-model-path" not in args
    assert [a for a in args if a.startswith("--") and a not in SGLANG_FLAGS[(0, 5, 3)]] == []


def test_sglang_refuses_what_kvbudget_has_not_read():
    with pytest.raises(KVBudgetError) as exc:
        argv("sglang", spec(SpecMethod.EAGLE, 2, DRAFT), "0.4.6")
    assert exc.value.param == "speculative" and "0.5.3" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(KVBudgetError) as exc:
        argv("sglang", spec(SpecMethod.SUFFIX, 2), "0.5.3")
    assert exc.value.param == "speculative" and "suffix" in str(exc.value)


def test_llama_server_draft_model_and_ngram():
    # common/arg.cpp: -hfd (--spec-draft-hf) the draft's Hub repository, --model-draft a file; --spec-type
    # draft-simple drafts up to --spec-draft-n-max; ngram-simple up to --spec-ngram-simple-size-m (speculative.cpp)
    args = argv("llamacpp", spec(SpecMethod.DRAFT_MODEL, 4, DRAFT))
    assert args[-6:] == ("-hfd", DRAFT, "--spec-type", "draft-simple", "--spec-draft-n-max", "4")
    local = argv("llamacpp", spec(SpecMethod.DRAFT_MODEL, 4, "/models/draft.gguf"))
    assert after(local, "--model-draft") == "/models/draft.gguf" and "-hfd" not in local
    args = argv("llamacpp", spec(SpecMethod.NGRAM, 6))
    assert args[-4:] == ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "6")
    assert "--spec-type" not in argv("llamacpp", None)
    for a in (args, local):
        assert [f for f in a if f.startswith("-") and f not in LLAMA_FLAGS] == []
    with pytest.raises(KVBudgetError) as exc:
        argv("llamacpp", spec(SpecMethod.EAGLE3, 2, DRAFT))
    assert exc.value.param == "speculative" and "\n" not in str(exc.value)


def test_a_pool_planned_from_its_settings_counts_its_drafter(tmp_path):
    """write_all without the search's setups plans each pool itself: the guard's bytes per token are the target's
    and the draft model's, by hand (vLLM: the drafter's layers join every block): Llama-3.1-8B 32 layers x 8 KV
    heads x 128 x 2 (K, V) x 2 bytes = 131,072, Llama-3.2-1B 16 x 8 x 64 x 2 x 2 = 32,768."""
    from kvbudget.deploy import write_all

    def guard(s: Speculative | None, folder: str) -> str:
        p = PoolPlan(gpu="H100-80GB", max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=8192,
                     gpu_memory_utilization=0.9, speculative=s)
        (tmp_path / folder).mkdir()
        write_all(Deployment(model="llama-3.1-8b", engine="vllm", pools=(p,)), str(tmp_path / folder))
        return (tmp_path / folder / "guard.yaml").read_text()

    assert "bytes_per_token: 131072\n" in guard(None, "plain")
    assert "bytes_per_token: 163840\n" in guard(spec(SpecMethod.DRAFT_MODEL, 2, DRAFT), "drafted")
