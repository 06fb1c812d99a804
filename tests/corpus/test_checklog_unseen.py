"""`kvbudget check-log` on public logs it had never read (tests/data/logs/unseen/): each is read, none crashes, and
the share of each held-out batch read is at least the figure reached (the readers were developed on the dev logs
only; the split rule and the second batch are in tests/data/logs/README.md)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from kvbudget.cli import main

UNSEEN = Path(__file__).parents[1] / "data" / "logs" / "unseen"
INDEX = json.loads((UNSEEN / "index.json").read_text())["logs"]
# The held-out shares read, as reached (the readers developed on the dev logs only): the first batch 25 of 25 (3 of
# 25 before the first readers changed, 23 of 25 after them); the second batch, collected before any further change,
# 23 of 26 (18 of 26 before); 48 of 51 together (94%). The 3 not read are refused for lines they lack (README.md).
# The third batch (heldout3), collected while the readers changed and measured once after: 21 of 37 (by the rule
# that a partial check with no row is not read; 21 by that rule before those changes too, 25 by the looser one):
# 69 of 88 together (78%), short of issue 55's 95%; the formats not read are listed in README.md.
# The fourth batch (heldout4), collected by the first results of fixed phrases while the readers changed again,
# measured once after those changes (branch s57read, developed on the dev, h2 and h3 logs): 21 of 36 (19 before):
# 90 of 124 over the four batches (73%).
# The fifth (heldout5), collected while the h4 readers were written, only logs whose KV line states a figure the
# engine computed: 23 of 27 after those readers (20 before): 113 of 151 over the five batches (75%).
# The sixth (heldout6), by the fifth's rule, collected while the h5 readers were written: 18 of 23 after them (17
# before): 131 of 174 over the six batches (75%).
# The seventh (heldout7), by the fifth's rule, collected by two collectors at once (vLLM/SGLang/TGI and the llama.cpp
# family) while the h6 readers were written, measured once after them (main at a6483df): 27 of 28 (96%; 26 before):
# 158 of 202 over the seven batches (78%).
# The eighth (heldout8), by the same rule and collectors, whose reports named no file or format, measured once on
# main at 3a2c5db before its README sections were read: 23 of 25 (92%; 23 before the h7 fix): 50 of 53 over the
# last two batches (94%), 181 of 227 over the eight (80%).
# The ninth (heldout9), the same way, measured once on main at c5debbb (the eighth round's readers) before its README
# sections were read: 25 of 27 (93%; 24 before this session's readers): 75 of 80 over the last three (94%), 206 of
# 254 over the nine (81%).
# The tenth (heldout10), the same way, measured once on main at ea9984c: 18 of 18 (18 before this session's readers
# too): 93 of 98 over the last four (94.9%), 224 of 272 over the ten (82%).
HELD_OUT_READ = {"held-out": (25, 25), "heldout2": (23, 26), "heldout3": (21, 37), "heldout4": (21, 36),
                 "heldout5": (23, 27), "heldout6": (18, 23), "heldout7": (27, 28), "heldout8": (23, 25),
                 "heldout9": (25, 27), "heldout10": (18, 18), "heldout11": (24, 25)}
# The 3 heldout2 logs not read when the batch was measured, looked at only after the figure was taken (so no longer
# held out): the readers made general for their formats read two of them; the third states nothing to check and
# says so in one line. The measured figure above stays 23 of 26 (22 by the later rule that a partial check with no row
# is not read: README.md).
LOOKED_AT = {"h2-vllm-issue-53961-dsv4-pro-mi300x-refusal.log": True,  # a refusal cut before its memory: needed checked
             "h2-vllm-ascend-pr-8289-npu-one-line-split.log": True,  # the one-line split's share, without a model
             "h2-tgi-issue-3115-gemma-3-args-multiline.log": False}  # TGI's limits all None: nothing to check

# The 16 heldout3 logs not read when the batch was measured (21 of 37), looked at only after the figure was taken (so
# dev material now): the readers made general for their formats (branch s57read) read 14 of them; the two left state
# nothing to check (a TGI warm-up refusal with no limit beside it) or name no model (a vLLM argument namespace of a
# model the catalog lacks), and say so in one line. The measured figure above stays 21 of 37.
LOOKED_AT_H3 = {"h3-tgi-issue-1164-title-warmup-refusal-256.log": True,  # the router's warm-up span and refusal
                "h3-tgi-issue-1067-awq-warmup-refusal.log": True,  # the shard's RuntimeError, without a model
                "h3-tgi-issue-755-title-warmup-refusal-llama-2-70b-gptq.log": False,  # the refusal alone
                "h3-llamacpp-issue-8101-kv-alloc-failed-1m-ctx-backticks.log": True,  # KV allocation refusal
                "h3-llamacpp-python-khoj-1127-kv-alloc-failed-timestamps.log": True,
                "h3-iklamacpp-pr-235-mla-kv-self-compute-oom.log": True,  # ik_llama.cpp's MLA c^KV
                "h3-iklamacpp-issue-749-eleven-gpus-kv-self-280gb-oom.log": True,
                "h3-iklamacpp-pr-239-sixteen-gpus-mla-kv-self.log": True,
                "h3-ollama-issue-9181-offload-line-kv-19.5gib.log": True,  # Ollama's logfmt offload line
                "h3-ollama-pr-12000-journal-offload-line-kv.log": True,
                "h3-vllm-issue-184-gpu-blocks-minus-one.log": True,  # vLLM 0.1's negative block count
                "h3-vllm-pr-10511-profiling-table-columns.log": True,  # V0's profiling table one field a line
                "h3-sglang-issue-7691-rocm-dp8-negative-profiled.log": True,  # a profiled pool below zero
                "h3-sglang-issue-1030-server-args-llama-3-8b.log": True,  # ServerArgs alone
                "h3-vllm-pr-45947-mrv2-cross-layer-kv-shape.log": True,  # the cross-layer KV cache shape
                "h3-vllm-issue-16474-rocm-mi300x-maverick-args-wrapped.log": False}  # a namespace, no model named


def read_outcome(entry: dict) -> tuple[bool, int, str]:
    """Whether check-log reads the log (exit 0 or 1: its KV lines found and a verdict reached; or, without a model,
    a partial check that names the --model to pass), its exit status and what it said on stderr (a partial check
    for another reason, a line the full check needs missing, is not counted). Anything but a KVBudgetError (which
    the CLI turns into exit 2) escapes as the exception it is."""
    argv = ["check-log", str(UNSEEN / entry["file"]), "--json"]
    if entry["model"]:
        argv += ["--model", entry["model"]]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    partial = status == 2 and out.getvalue().startswith("{") and json.loads(out.getvalue()).get("partial")
    no_model = bool(partial) and "for the rows that need the model" in err.getvalue()
    return status in (0, 1) or no_model, status, err.getvalue().strip()


def test_index_lists_every_unseen_log_with_its_source_and_split():
    assert {e["file"] for e in INDEX} == {p.name for p in UNSEEN.glob("*.log")}
    splits = ("dev", "held-out", *(f"heldout{n}" for n in range(2, 12)))
    assert all(e["source"] and e["licence"] and e["split"] in splits for e in INDEX)


@pytest.mark.parametrize("entry", INDEX, ids=lambda e: e["file"])
def test_unseen_log_never_crashes(entry):
    """No log makes check-log raise anything but its own one-line errors (exit 2)."""
    _, status, err = read_outcome(entry)
    assert status in (0, 1, 2)
    assert status != 2 or err.count("\n") == 0, err


@pytest.mark.parametrize("split", HELD_OUT_READ)
def test_held_out_read_rate(split):
    held_out = [e for e in INDEX if e["split"] == split]
    outcomes = {e["file"]: read_outcome(e) for e in held_out}
    read = [f for f, (ok, _, _) in outcomes.items() if ok]
    least, total = HELD_OUT_READ[split]
    assert len(held_out) == total and len(read) >= least, sorted(set(outcomes) - set(read))


def test_held_out_read_rate_together():
    read, total = (sum(HELD_OUT_READ[s][i] for s in HELD_OUT_READ) for i in (0, 1))
    assert total == sum(e["split"] in HELD_OUT_READ for e in INDEX) and read / total >= 0.83


def test_held_out_read_rate_since_the_seventh_batch():
    """The issue's 95% on the batches measured since collection ran blind to the readers' state (two collectors at
    once, nobody running check-log on them), each measured once: 117 of 123 over the seventh to the eleventh."""
    later = [s for s in HELD_OUT_READ if s.startswith("heldout") and int(s[len("heldout"):]) >= 7]
    read, total = (sum(HELD_OUT_READ[s][i] for s in later) for i in (0, 1))
    assert len(later) == 5 and read / total >= 0.95


@pytest.mark.parametrize("name", LOOKED_AT)
def test_looked_at_heldout2_logs(name):
    entry = next(e for e in INDEX if e["file"] == name)
    read, status, err = read_outcome(entry)
    assert read == LOOKED_AT[name], err
    if not read:  # one line naming what to pass, not a partial check: counted as not read
        assert status == 2 and "nothing to check" in err and "--max-total-tokens" in err and err.count("\n") == 0


@pytest.mark.parametrize("name", LOOKED_AT_H3)
def test_looked_at_heldout3_logs(name):
    entry = next(e for e in INDEX if e["file"] == name)
    read, status, err = read_outcome(entry)
    assert read == LOOKED_AT_H3[name], err
    if not read:  # one line saying what to pass
        assert status == 2 and err.count("\n") == 0 and ("pass" in err)


def test_heldout3_read_after_being_looked_at():
    """21 of 37 as measured; 35 of 37 after the readers were made general for the 16 not read (not a held-out
    measure: those 16 were looked at)."""
    read = sum(read_outcome(e)[0] for e in INDEX if e["split"] == "heldout3")
    assert read >= 35


# The 15 heldout4 logs not read when the batch was measured (21 of 36), looked at only after the figure was taken (so
# dev material now): the readers made general for their formats (branch s58read) read 10 of them; the five left state
# nothing a reader could check (a pane-cut TGI Args line, a vLLM engine line cut before its blocks naming a model
# not readable here, an SGLang log cut before its pool, LM Studio's bare 'rs cache' refusal) or name a model kvbudget
# does not size for their engine yet (DeepSeek-V4's compressed cache under SGLang), and say so in one line.
LOOKED_AT_H4 = {"h4-vllm-issue-11550-v0-worker-profiling-cut.log": True,  # the profiling share line, cut after it
                "h4-ollama-issue-8430-offload-line-wrapped.log": True,  # hard-wrapped logfmt offload line
                "h4-llamacpp-gpustack-1231-timestamped-kv-self-4-slots.log": True,  # llama_init_from_model's KV self
                "h4-ollama-issue-7323-journal-n-seq-max-4-ctx.log": True,  # the context's lines alone
                "h4-ollama-pr-16031-llama-server-n-ctx-262144-cut.log": True,
                "h4-iklamacpp-pr-237-mla-n-ctx-163840-layers-cut.log": True,
                "h4-llamacpp-pr-22493-pid-prefix-n-seq-max-6-cut.log": True,
                "h4-llamacpp-issue-10188-llama-3.2-3b-n-ctx-131072-cut.log": True,  # n_ctx against the model's
                "h4-llamacpp-python-1943-qwen2.5-coder-7b-kv-self.log": True,  # KV self size, cells from its K part
                "h4-vllm-miaai-122-concurrency-line-quoted-in-prose.log": True,  # the concurrency line alone
                "h4-vllm-xinference-1115-internlm-20b-blocks-cut-arrow-keys.log": False,  # engine line, model unread
                "h4-tgi-issue-653-k9s-box-args-cut.log": False,  # the Args line cut before any limit
                "h4-sglang-issue-40558-sm120-kv-budget-reserve-cut.log": False,  # cut before the pool
                "h4-sglang-pr-28620-dsv4-flash-l20-token-pool-prose.log": False,  # the model's cache not sized yet
                "h4-lmstudio-2321-rs-cache-alloc-refusal.log": False}  # the refusal alone


@pytest.mark.parametrize("name", LOOKED_AT_H4)
def test_looked_at_heldout4_logs(name):
    entry = next(e for e in INDEX if e["file"] == name)
    read, status, err = read_outcome(entry)
    assert read == LOOKED_AT_H4[name], err
    if not read:  # one line saying what to pass, or what kvbudget does not size yet (a partial check beside it)
        assert status == 2 and err.count("\n") == 0 and ("pass" in err or "does not size" in err)


def test_heldout4_read_after_being_looked_at():
    """21 of 36 as measured; 31 of 36 after the readers were made general for the 15 not read (not a held-out
    measure: those 15 were looked at)."""
    read = sum(read_outcome(e)[0] for e in INDEX if e["split"] == "heldout4")
    assert read >= 31


# The logs of the fifth batch on not read when their batch was measured, each looked at only after its figure was
# taken (dev material since): the readers made general for their formats read every one (the measured figures above
# stay as measured). heldout5 (23 of 27 measured; branch s59read): ggml's loaders' memory_size and n_mem, SGLang with
# no memory after the weights, a budget below zero, the 0.7-0.8 refusal in "GB". heldout6 (18 of 23;
# test_check_log_h6_formats.py): a line folded inside '( )', size lines without n_ctx, RPC[host:port] KV buffers, a
# V0 refusal retyped ('sew len'), 2023's 'model size = 30B' without n_ctx. heldout7 (27 of 28): 2023's kv self size
# with the model given. heldout8 (23 of 25): vLLM's CPU worker refusing a cache its NUMA node cannot hold, 2023's
# Metal 'kv' buffer. heldout9 (25 of 27): a V0 budget and blocks without max_model_len, llama.cpp's 'Meta()' buffer.
# heldout11 (24 of 25; test_check_log_h11_formats.py): the Gaudi fork's budget beside its HPU-graph reserve.
LOOKED_AT_LATER = ("h5-koboldcpp-41-2023-gptj-memory-size-n-mem.log",
                   "h5-sglang-inferencex-2128-dsv4-pro-h200-no-kv-memory.log",
                   "h5-vllm-ascend-9372-vnpu-negative-budget.log",
                   "h5-vllm-issue-15617-v0.8.2-refusal-gb-8x4090.log",
                   "h6-llamacpp-odysseus-831-docker-cpu-kv-size-wrapped-80-cols.log",
                   "h6-llamacpp-issue-15105-vulkan-iswa-gpt-oss-120b-cells-refusal.log",
                   "h6-llamacpp-beowulf-2-vulkan-rpc-kv-buffers-crash.log",
                   "h6-vllm-langchain-17906-refusal-curly-quotes-sew-len.log",
                   "h6-llamacpp-pr-1826-2023-metal-30b-kv-self-mb.log",
                   "h7-textgen-webui-issue-866-2023-ggjt-v1-kv-self-3200mb.log",
                   "h8-vllm-cpu-lmcache-pr-3614-node-memory-kv-refused.log",
                   "h8-llamacpp-issue-3606-2023-metal-kv-buffer-402mb-over-working-set.log",
                   "h9-vllm-0.7-issue-15815-qwen2.5-32b-l40s-tp2-cuda-blocks.log",
                   "h9-llamacpp-issue-26208-rocm-gfx1201-journal-meta-kv-buffer-4096mib.log",
                   "h11-vllm-gaudi-tutorials-understanding-vllm-llama-3.1-8b-grep-free-device-memory.log")


@pytest.mark.parametrize("name", LOOKED_AT_LATER)
def test_looked_at_logs_of_later_batches_are_read(name):
    entry = next(e for e in INDEX if e["file"] == name)
    read, _, err = read_outcome(entry)
    assert read, err


@pytest.mark.parametrize("split", [f"heldout{n}" for n in range(5, 12)])
def test_later_batches_are_read_whole_after_being_looked_at(split):
    """Each batch from the fifth on is read whole now (not a held-out measure: its misses were looked at)."""
    assert all(read_outcome(e)[0] for e in INDEX if e["split"] == split)
