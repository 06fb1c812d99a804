"""Every request field the guard reads is checked before it is used (issue 50): a malformed request is a 400
naming the field, never a 500; and a property test over arbitrary JSON bodies holds the parser to it."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

httpx = pytest.importorskip("httpx")

from kvbudget.guard.gate import Pending, Refusal  # noqa: E402
from kvbudget.guard.request import BadRequest, parse_json, read_request  # noqa: E402
from kvbudget.guard.server import build_guard  # noqa: E402

BUDGET = 131_072 * 100_000  # llama-3.1-8b on vLLM: room for 100,000 tokens
MSGS = [{"role": "user", "content": "hi"}]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def offline_guard(**kw):
    """A guard predicting with llama-3.1-8b; nothing is served (its gate is called directly)."""
    guard, _ = build_guard(["http://127.0.0.1:9"], "vllm", model="llama-3.1-8b", kv_memory=BUDGET, max_model_len=32_768,
                           decision_log=io.StringIO(), **kw)
    return guard


@pytest.mark.parametrize(("raw", "param", "said"), [
    # a content part's text that is not a string: the prompt estimate took len() of it, a 500
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}', "messages",
     "messages[0].content[0].text must be a string"),
    (b'{"messages": [{"role": "user", "content": [{"type": 1, "text": "a"}]}]}', "messages",
     "messages[0].content[0].type must be a string"),
    (b'{"messages": [{"role": "user", "content": ["a"]}]}', "messages", "messages[0].content[0] must be an object"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": null}]}]}', "messages",
     "messages[0].content[0].text must be a string, not missing or null"),  # found by the property below
    # a message without a role: the tokenizer's check raised inside the guard
    (b'{"messages": [{"content": "hi"}]}', "messages", "messages[0].role must be a string"),
    # 10^400 tokens: the cap's arithmetic overflowed a float, a 500
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 400 + b"}", "max_tokens",
     "max_tokens must be from 0 to 2,147,483,647 (got a number of 401 digits)"),
    (b'{"prompt": "x", "n": 4294967296}', "n", "n must be from 1 to 2,147,483,647"),
    (b'{"prompt": "x", "n_predict": -2}', "n_predict", "n_predict must be from -1"),
    # more digits than Python reads: its ValueError escaped the JSON reader, a 500
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 5000 + b"}", None,
     "not valid JSON"),
    (b"[" * 100_000, None, "not valid JSON"),  # nesting deeper than the parser goes
    (b'"just a string"', None, "must be a JSON object"),
    (b"\xff\xfe", None, "not valid JSON"),
])
def test_each_bad_field_is_a_400_naming_it(raw, param, said):
    guard = offline_guard()
    path = CHAT if b"messages" in raw or param is None else COMPLETIONS
    refusal = guard.gate.read(path, raw, {}, "127.0.0.1")
    assert isinstance(refusal, Refusal), refusal
    assert refusal.status == 400 and refusal.param == param and said in refusal.message, refusal


def test_the_tokenizers_refusal_is_a_400_too():
    """With a tokenizer, the guard counts prompts through the chat template; a template that refuses the messages
    (a TokenizerError) raised through the gate as a 500."""
    from kvbudget.errors import TokenizerError

    guard = offline_guard()

    def refuses(body):
        raise TokenizerError("the chat template failed on these messages: roles must alternate")

    guard.gate.admission.count_prompt = refuses
    refusal = guard.gate.read(CHAT, json.dumps({"messages": MSGS}).encode(), {}, "")
    assert isinstance(refusal, Refusal) and refusal.status == 400 and refusal.param == "messages"
    assert "roles must alternate" in refusal.message


def test_through_the_proxy_a_bad_part_and_a_huge_limit_are_400s(fake_engine, serve):
    guard, _ = build_guard([fake_engine.url], "vllm", model="llama-3.1-8b", kv_memory=BUDGET, poll_interval=0.05,
                           decision_log=io.StringIO())
    fake_engine.usage = 0.8  # level 1: the cap's arithmetic runs
    with serve(guard.app()) as g:
        for body, param in (({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages"),
                            ({"messages": MSGS, "max_tokens": 10**400}, "max_tokens")):
            answer = httpx.post(f"{g.url}{CHAT}", content=json.dumps(body).encode(), timeout=10)
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["type"] == "invalid_request_error" and error["param"] == param, error
        assert not fake_engine.bodies  # nothing reached the engine


# --- the property: any JSON body is a clear 400 or an admitted request, never an exception --------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(
    max_size=8)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=6), inner, max_size=4), max_leaves=12)
FIELDS = ("messages", "prompt", "max_tokens", "max_completion_tokens", "n_predict", "n", "best_of", "stream",
          "use_beam_search")
# near-valid values for the fields the guard reads, mixed with anything at all
part = st.fixed_dictionaries({}, optional={"type": st.sampled_from(["text", "image_url"]) | json_values,
                                           "text": st.text(max_size=20) | json_values})
content = st.text(max_size=20) | st.lists(part, max_size=3) | json_values
message = st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "system"]) | json_values,
                                              "content": content})
field_values = {
    "messages": st.lists(message, max_size=3) | json_values,
    "prompt": st.text(max_size=20) | st.lists(st.integers(-2, 10**40), max_size=4) | st.lists(
        st.lists(st.integers(-1, 100), max_size=3), max_size=3) | json_values,
    **{name: st.integers(-3, 2**40) | st.integers() | json_values
       for name in ("max_tokens", "max_completion_tokens", "n_predict", "n", "best_of")},
    "stream": st.booleans() | json_values, "use_beam_search": st.booleans() | json_values,
}
bodies = st.fixed_dictionaries({}, optional=field_values) | json_values


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, chat=st.booleans(), usage=st.sampled_from([0.0, 0.75, 0.9, 0.97]))
def test_any_json_body_is_a_clear_400_or_a_decision(body, chat, usage):
    guard = GUARD
    replica = guard.replicas[0]
    replica.observed, replica.observed_at, replica.level = usage, 1e18, 0  # fresh for ever, at every level
    raw = json.dumps(body).encode()
    read = guard.gate.read(CHAT if chat else COMPLETIONS, raw, {}, "127.0.0.1")
    if isinstance(read, Refusal):
        assert read.status == 400 and read.kind == "invalid_request_error" and read.message
        assert "\n" not in read.message
        with pytest.raises(BadRequest):  # the parser agrees, and names a field the guard reads where it names one
            read_request(parse_json(raw), chat) if read.param is not None else parse_json(raw)
        assert read.param is None or read.param in FIELDS
        return
    assert isinstance(read, Pending)
    admitted = guard.gate.admit(read, set())
    if isinstance(admitted, Refusal):
        assert admitted.status == 503
        return
    json.dumps(admitted.decision.body)  # what is forwarded can be sent
    admitted.release()


GUARD = offline_guard()
