"""`kvbudget tokens`: exact counts against a real tokenizer and chat template, built offline."""

from __future__ import annotations

import json
import tracemalloc

import pytest

pytest.importorskip("transformers", reason="test extra: pip install -e '.[test]'")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import kvbudget
from kvbudget import KVBudgetError
from kvbudget.cli import main
from kvbudget.tokens import PromptCounter, distribution

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Retrieval augmented generation stitches passages.",
          "KV caches grow with every token of every sequence.", "Bonjour, ça va? Ünïcödé tëxt and numbers 12345."]


def render_by_hand(messages) -> str:
    out = "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages)
    return out + "<|assistant|>\n"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<s>"]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 50, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|end|>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)
    (folder / "raw-tokenizer.json").write_text(tok.to_str())
    return folder


@pytest.fixture(scope="module")
def raw(tok_dir):
    return Tokenizer.from_file(str(tok_dir / "raw-tokenizer.json"))


def encode(raw, text: str) -> int:
    return len(raw.encode(text, add_special_tokens=False).ids)


MESSAGES = [{"role": "system", "content": "You answer from the passages."},
            {"role": "user", "content": CORPUS[1] + "\n\n" + CORPUS[3] + "\nWhat grows?"}]


def test_request_count_equals_encoding_the_rendered_template(tok_dir, raw):
    result = PromptCounter(tok_dir).count_request(MESSAGES, max_tokens=64)
    assert result.prompt_tokens == encode(raw, render_by_hand(MESSAGES))
    assert sum(p.tokens for p in result.parts) == result.prompt_tokens
    assert [p.name for p in result.parts] == ["message 1 (system)", "message 2 (user)", "template"]
    assert result.parts[0].tokens == encode(raw, MESSAGES[0]["content"])
    assert result.parts[-1].tokens > 0  # role markers, separators, the generation prompt


def test_documents_question_system(tok_dir, raw):
    docs = [("a.txt", CORPUS[0]), ("b.txt", CORPUS[2])]
    result = PromptCounter(tok_dir).count_documents(docs, "Why?", "Be brief.")
    user = "\n\n".join([CORPUS[0], CORPUS[2], "Why?"])
    expected = encode(raw, render_by_hand([{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": user}]))
    assert result.prompt_tokens == expected
    assert [p.name for p in result.parts] == ["system", "a.txt", "b.txt", "question", "template and separators"]
    raw_only = PromptCounter(tok_dir).count_documents(docs, "Why?", None, template=False)
    assert raw_only.prompt_tokens == encode(raw, user)


def test_llamacpp_adds_the_vocabularys_bos(tok_dir):
    vllm = PromptCounter(tok_dir, engine="vllm")
    llama = PromptCounter(tok_dir, engine="llamacpp")
    assert llama.count_request(MESSAGES).prompt_tokens == vllm.count_request(MESSAGES).prompt_tokens
    llama.tokenizer.add_bos_token = True  # as a vocabulary with tokenizer.ggml.add_bos_token does
    assert llama.count_request(MESSAGES).prompt_tokens == vllm.count_request(MESSAGES).prompt_tokens + 1


def test_every_registered_engine_is_accepted(tok_dir, raw, capsys):
    # hf-static used to be refused; the engines' own BOS rule decides, so the library engines count like vLLM
    expected = encode(raw, render_by_hand(MESSAGES))
    for engine in kvbudget.ENGINES:
        if not kvbudget.get_engine(engine).prompt_adds_bos:
            assert PromptCounter(tok_dir, engine=engine).count_request(MESSAGES).prompt_tokens == expected, engine
    request = tok_dir.parent / "request.json"
    request.write_text(json.dumps({"messages": MESSAGES}))
    assert main(["tokens", str(tok_dir), str(request), "--engine", "hf-static", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == expected
    assert main(["tokens", str(tok_dir), str(request), "--engine", "nope"]) == 2
    assert "--engine: unknown engine 'nope'" in capsys.readouterr().err


def _write_log(path, lines, raw=None):
    expected_prompt, expected_total = [], []
    with path.open("w") as fh:
        for i in range(lines):
            msgs = [{"role": "user", "content": (CORPUS[i % 4] + " ") * (1 + i % 17)}]
            fh.write(json.dumps({"messages": msgs, "max_tokens": 10 * (i % 7)}) + "\n")
            if raw is not None:
                n = encode(raw, render_by_hand(msgs))
                expected_prompt.append(n)
                expected_total.append(n + 10 * (i % 7))
    return expected_prompt, expected_total


def _peak(counter, path):
    from kvbudget.files import iter_lines

    tracemalloc.start()
    stats = counter.count_jsonl(iter_lines(str(path)), batch=128)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return stats, peak


def test_jsonl_distribution_is_exact(tok_dir, raw, tmp_path):
    from array import array

    path = tmp_path / "log.jsonl"
    expected_prompt, expected_total = _write_log(path, 3000, raw)
    stats = PromptCounter(tok_dir).count_jsonl(__import__("kvbudget.files").files.iter_lines(str(path)))
    assert stats.count == 3000
    assert stats.prompt_tokens == distribution(array("q", expected_prompt))
    assert stats.total_tokens == distribution(array("q", expected_total))


def test_jsonl_memory_does_not_grow_with_the_file(tok_dir, tmp_path):
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    _write_log(small, 2000)
    _write_log(large, 16000)
    counter = PromptCounter(tok_dir)
    _, small_peak = _peak(counter, small)
    stats, large_peak = _peak(counter, large)
    assert stats.count == 16000
    # 8x the file, but only the 8-byte counts per request grow: nothing like 8x the peak
    assert large_peak < small_peak + 16000 * 2 * 8 * 2


def test_distribution_nearest_rank():
    from array import array

    d = distribution(array("q", range(1, 101)))
    assert (d.count, d.mean, d.p50, d.p90, d.p99, d.max) == (100, 50.5, 50, 90, 99, 100)


def test_cli_json_contracts(tok_dir, tmp_path, capsys):
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"messages": MESSAGES, "max_tokens": 100}))
    assert main(["tokens", str(tok_dir), str(req), "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert set(one) >= {"prompt_tokens", "parts"} and one["total_tokens"] == one["prompt_tokens"] + 100
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps({"messages": MESSAGES, "max_tokens": k}) for k in (1, 2, 3)) + "\n")
    assert main(["tokens", str(tok_dir), str(log), "--json"]) == 0
    many = json.loads(capsys.readouterr().out)
    assert many["count"] == 3 and set(many["prompt_tokens"]) >= {"mean", "p50", "p90", "p99", "max"}
    assert many["prompt_tokens"]["max"] == one["prompt_tokens"]


def test_estimate_and_plan_take_counted_lengths(tok_dir, tmp_path, capsys):
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "hidden_size": 64, "intermediate_size": 128, "vocab_size": 600, "max_position_embeddings": 4096,
           "torch_dtype": "bfloat16"}
    (tok_dir / "config.json").write_text(json.dumps(cfg))
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"messages": MESSAGES, "max_tokens": 100}))
    prompt = PromptCounter(tok_dir).count_request(MESSAGES).prompt_tokens
    assert main(["estimate", str(tok_dir), "--prompt-file", str(req), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["context"] for p in data["points"]] == [prompt + 100]
    assert main(["estimate", str(tok_dir), "--prompt-file", str(req), "--max-new-tokens", "7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["points"][0]["context"] == prompt + 7
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps({"messages": MESSAGES, "max_tokens": k}) for k in range(100)) + "\n")
    assert main(["plan", str(tok_dir), "--gpu", "L4", "--lengths-from", str(log), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["capacity"]["max_model_len"] == prompt + 98  # nearest-rank p99 of max_tokens 0..99
    assert any("p99" in n and "mean" in n for n in planned["notes"])


def test_approximate_is_labelled(tmp_path, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text("x" * 400)
    assert main(["tokens", "llama-3.1-8b", str(doc), "--approximate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["approximate"] is True and data["prompt_tokens"] == 100
    assert main(["tokens", "llama-3.1-8b", str(doc), "--approximate"]) == 0
    assert "approximate" in capsys.readouterr().out


@pytest.mark.parametrize("make_argv, expected", [
    (lambda t, d: ["tokens", str(t), str(d / "allbad.jsonl")], "no requests (1 bad line(s); line 1: invalid JSON"),
    (lambda t, d: ["tokens", str(d)], "no tokenizer files"),
    (lambda t, d: ["tokens", str(t), str(d / "nomsg.json")], "'messages'"),
    (lambda t, d: ["tokens", str(t), str(d / "missing.txt")], "cannot read"),
    (lambda t, d: ["estimate", "llama-3.1-8b", "--max-new-tokens", "5"], "goes with --prompt-file"),
    (lambda t, d: ["estimate", str(t), "--prompt-file", str(d / "nomsg.json"), "--context", "10"],
     "give --context or a counted length"),
    (lambda t, d: ["plan", str(t), "--gpu", "L4", "--lengths-from", str(d / "bad.jsonl"), "--max-model-len", "99"],
     "give --max-model-len or a counted length"),
])
def test_bad_input(tok_dir, tmp_path, capsys, make_argv, expected):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"messages": MESSAGES}) + "\n{oops\n")
    (tmp_path / "allbad.jsonl").write_text("{oops\n")
    (tmp_path / "nomsg.json").write_text(json.dumps({"prompt": "hi"}))
    assert main(make_argv(tok_dir, tmp_path)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and expected in err, err


def test_offline_hub_tokenizer_says_how_to_fix(tmp_path, monkeypatch):
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(KVBudgetError, match="not in the local Hugging Face cache.*approximate=True"):
        PromptCounter("llama-3.1-8b")


def test_simulate_a_request_log_with_exact_prompt_lengths(tok_dir, raw, tmp_path, capsys):
    """`kvbudget simulate --request-log`: each prompt as the engine caches it (template rendered, counted), each
    output its max_tokens, arrivals from the lines; a line without max_tokens draws its output."""
    requests = [{"messages": [{"role": "user", "content": CORPUS[i % 4] * (i + 1)}], "max_tokens": 20 + i,
                 "arrival": i * 0.5} for i in range(6)]
    log = tmp_path / "requests.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in requests) + "\n")
    argv = ["simulate", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "4096", "--request-log", str(log),
            "--tokenizer", str(tok_dir), "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests"] == data["completed"] == 6
    assert data["prompt_tokens"] == sum(encode(raw, render_by_hand(r["messages"])) for r in requests)
    assert data["output_tokens"] == sum(r["max_tokens"] for r in requests)
    del requests[2]["arrival"]
    log.write_text("\n".join(json.dumps(r) for r in requests) + "\n")
    assert main(argv) == 2
    assert f"{log}:3: no 'arrival'" in capsys.readouterr().err
    assert main(argv + ["--rate", "2"]) == 0  # arrivals at a rate instead


def test_pipelined_counts_come_out_in_order_and_equal_the_raw_encoder(tok_dir, raw):
    """count_lines encodes one batch while it renders the next: every request's count, in the input's order,
    equals the raw tokenizer's `encode` of its rendered prompt (which also checks encode_batch_fast's lengths),
    bad lines passed over where they are."""
    lines, expected = [], []
    for i in range(700):  # batches of 64: ten full ones and a remainder
        if i % 97 == 5:
            lines.append("{not json")
            continue
        msgs = [{"role": "user", "content": (CORPUS[i % 4] + " ") * (1 + i % 13)}]
        lines.append(json.dumps({"messages": msgs, "max_tokens": i}))
        expected.append((encode(raw, render_by_hand(msgs)), i))
    skipped: list = []
    got = [(n, max_tokens) for n, max_tokens, _ in PromptCounter(tok_dir).count_lines(lines, batch=64,
                                                                                        skipped=skipped)]
    assert got == expected
    assert [number for number, _ in skipped] == [i + 1 for i in range(700) if i % 97 == 5]


GOOD_LINE = json.dumps({"messages": MESSAGES, "max_tokens": 7})


@pytest.mark.parametrize("lines, expected", [
    (['{"messages": ' + "[" * 100_000], "line 1: nests [ and { more than 64 levels deep"),
    (['{"messages": [{"role": "user", "content": "x"}], "max_tokens": ' + "9" * 5000 + "}"],
     "line 1: invalid JSON: a number of over 4,300 digits"),
    (['{"messages": [{"role": "user", "content": "x"}], "max_tokens": ' + "9" * 4000 + "}"],
     "line 1: 'max_tokens' must be a whole number from 0 to 16,777,216"),
    (['{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400}'], "line 1: 'max_tokens' must be"),
])
def test_a_hostile_request_log_line_is_one_line(tmp_path, capsys, lines, expected):
    """A line nested 100,000 deep (a RecursionError), a number of 5,000 digits (a ValueError) or a max_tokens of
    4,000 digits (an OverflowError in the counts) is a bad line like any other: passed over beside good ones, and
    the one-line refusal when nothing else is left; simulate names it."""
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(lines) + "\n")
    assert main(["tokens", "llama-3.1-8b", str(log), "--approximate"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and expected in err, err
    log.write_text("\n".join([GOOD_LINE, *lines]) + "\n")
    assert main(["tokens", "llama-3.1-8b", str(log), "--approximate", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["count"] == 1 and stats["skipped_lines"] == 1
    assert main(["simulate", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "4096", "--request-log", str(log),
                 "--approximate", "--rate", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected.replace("line 1", "line 2") in err, err


def test_a_request_log_that_is_not_text_is_named_by_line(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_bytes((GOOD_LINE + "\n").encode() * 300 + b'{"messages": "\xff\xfe"}\n')  # past the first 8 KB
    for argv in (["tokens", "llama-3.1-8b", str(log), "--approximate"],
                 ["plan", "llama-3.1-8b", "--gpu", "H100", "--lengths-from", str(log), "--approximate"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{log}:301: not UTF-8 text" in err, err


def test_a_request_log_line_without_end_is_not_read_whole(tmp_path):
    """A line is one document: 64 MiB without a newline (1 GB reads the same) is refused after its first 16 MiB."""
    from kvbudget.tokens import lengths_context

    log = tmp_path / "log.jsonl"
    with open(log, "wb") as fh:
        fh.write(GOOD_LINE.encode() + b"\n")
        fh.truncate(fh.tell() + (64 << 20))  # sparse
    tracemalloc.start()
    try:
        with pytest.raises(KVBudgetError, match="log.jsonl:2: a line longer than 16,777,216 bytes") as e:
            lengths_context(None, str(log), approximate=True)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 40 << 20 and e.value.param == "lengths_from"


# -- the request-log reader under random input (issue 50) -------------------------------------------------------

from hypothesis import given, settings  # noqa: E402  (after the importorskip above)
from hypothesis import strategies as st  # noqa: E402

REQUEST = st.fixed_dictionaries(
    {"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                                 "content": st.text(max_size=40)}), min_size=1, max_size=3)},
    optional={"max_tokens": st.integers(0, 1 << 24)})
JUNK = st.one_of(  # lines that are never a chat request, each for its own reason
    st.text(st.characters(blacklist_characters="\n\0"), max_size=30).map(lambda t: "#" + t),  # not JSON
    st.integers(65, 3000).map(lambda n: "[" * n),  # nested too deep
    st.integers(4301, 6000).map(lambda n: '{"messages": [], "max_tokens": ' + "7" * n + "}"),  # too many digits
    st.integers((1 << 24) + 1, 10**4000).map(lambda n: f'{{"messages": [{{"role": "user"}}], "max_tokens": {n}}}'),
    st.sampled_from(["[]", "5", '"text"', "null", '{"messages": []}', '{"messages": [5]}', '{"prompt": "hi"}',
                     '{"messages": [{"role": "user"}], "max_tokens": -1}', "1e400", "NaN"]),
)


def _counted(path):
    """count_jsonl over the file, in bounded time and memory: the stats or the one-line error."""
    import time

    from kvbudget.tokens import read_log

    tracemalloc.start()
    start = time.perf_counter()
    try:
        return PromptCounter(None, approximate=True).count_jsonl(read_log(str(path)))
    except KVBudgetError as exc:
        assert "\n" not in str(exc)
        return exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert time.perf_counter() - start < 2 and peak < 8 << 20


@settings(max_examples=100, deadline=None)
@given(lines=st.lists(st.one_of(REQUEST.map(lambda r: ("ok", r)), JUNK.map(lambda j: ("junk", j))), max_size=12))
def test_request_logs_of_requests_and_junk(tmp_path_factory, lines):
    """Every request counted (approximate: 4 characters a token, per message), every junk line skipped by its
    number, whatever surrounds it; nothing but junk is the one-line refusal."""
    path = tmp_path_factory.getbasetemp() / "fuzz.jsonl"
    path.write_text("\n".join(json.dumps(x) if kind == "ok" else x for kind, x in lines) + "\n")
    got = _counted(path)
    requests = [x for kind, x in lines if kind == "ok"]
    if not requests:
        assert isinstance(got, KVBudgetError) and "holds no requests" in str(got)
        return
    prompts = [sum(-(-len(m["content"]) // 4) for m in r["messages"]) for r in requests]
    totals = [p + r.get("max_tokens", 0) for p, r in zip(prompts, requests, strict=True)]
    assert got.count == len(requests) and got.prompt_tokens.max == max(prompts) and got.total_tokens.max == max(totals)
    assert sum(prompts) == round(got.prompt_tokens.mean * got.count)
    assert [n for n, _ in got.skipped] == [i for i, (kind, _) in enumerate(lines, 1) if kind == "junk"]


@settings(max_examples=100, deadline=None)
@given(head=st.sampled_from([b"", GOOD_LINE.encode() + b"\n"]), noise=st.binary(max_size=400))
def test_request_logs_of_random_bytes(tmp_path_factory, head, noise):
    path = tmp_path_factory.getbasetemp() / "bytes.jsonl"
    path.write_bytes(head + noise)
    got = _counted(path)
    assert isinstance(got, KVBudgetError) or got.count >= 1
