"""The web API under arbitrary parameters: whatever keys and values a request carries, the answer is a 200 or a
4xx whose JSON error is one line naming a field, never a 500, never a server path."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from kvbudget.web import api
from kvbudget.web.app import create_app

HOSTILE = ["1" + "0" * 400, "inf", "-inf", "nan", "NaN", "abc", "1e400", "-1", "0", "99999999999999999999",
           "1.5", "1,2,3", "0:0", "5:2", "-5GiB", "1e308", "9" * 30 + "GiB", ":", "0x10", "1_000", "٣", " ", "",
           "\x00", "1" * 5000, "[]", "{}", "on", "off", "true", "upload:model-x.json", "../../etc/passwd"]
FAIR = ["1", "2", "4", "8", "16", "4k", "32k", "0.5", "0.9", "8GiB", "24GB", "100", "L4", "H100-80GB", "vllm",
        "sglang", "llamacpp", "fp8", "auto", "cuda", "cpu", "0:50"]
VALUES = st.one_of(st.sampled_from(HOSTILE + FAIR), st.text(max_size=12))
BASE = {"estimate": [("model", "llama-3.1-8b")], "plan": [("model", "llama-3.1-8b"), ("gpu", "L4")],
        "compare": [("model", "llama-3.1-8b"), ("model", "mistral-7b")],
        "simulate": [("model", "llama-3.1-8b"), ("gpu", "L4"), ("rate", "5"), ("requests", "40"),
                     ("max_model_len", "4096")],
        "recommend": [("model", "llama-3.1-8b"), ("rate", "2"), ("requests", "20"), ("slo", "ttft_p99=2s"),
                      ("gpus", "H100-80GB,L40S"), ("gpu_price", "1"), ("max_gpus", "1"), ("tp", "1"),
                      ("kv_dtype", "auto")]}


# The option readers (kvbudget.commands.options, kvbudget.units) still let 400-digit numbers, inf and nan through
# to an OverflowError deep in the planner (a 500 here), and a few command errors name no parameter; bounding them is
# the readers' work (issue 50, the cli slice). Until then these two tests fail on those values: xfail, not strict.

def _keys(command: str) -> st.SearchStrategy[str]:
    known = sorted(api.OPTIONS[command]) + {"simulate": ["trace", "guard"], "recommend": ["trace"]}.get(command, [])
    return st.one_of(st.sampled_from(known), st.sampled_from(["model", "bogus", "kv-memory", "TP", ""]))


@pytest.fixture(scope="module")
def client():
    limits = api.Limits(simulate_seconds=1.0, simulate_requests=2000, recommend_seconds=2.0)
    return TestClient(create_app(upload_dir=Path(tempfile.mkdtemp(prefix="kvbudget-fuzz-")), limits=limits),
                      raise_server_exceptions=False)


def _check(client: TestClient, command: str, extra: list[tuple[str, str]]) -> None:
    given_keys = {k for k, _ in extra}
    params = [(k, v) for k, v in BASE[command] if k not in given_keys or k == "model"] + extra
    r = client.get(f"/api/{command}", params=params)
    assert r.status_code != 500 and r.status_code < 600, (command, extra, r.text[:300])
    if r.status_code == 200:
        return
    body = r.json()
    assert isinstance(body["error"], str) and "\n" not in body["error"] and "Traceback" not in body["error"]
    # no field to show it beside (at the top of the page): a nameless parameter, a query past the page's length
    nameless = "without a name" in body["error"] or r.status_code == 414
    assert (isinstance(body["field"], str) and body["field"]) or nameless, (command, extra, body)
    assert str(Path(tempfile.gettempdir())) + "/" not in body["error"], body


@pytest.mark.parametrize("command", sorted(BASE))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_parameters_get_an_answer_or_a_400_naming_a_field(client, command, data):
    extra = data.draw(st.lists(st.tuples(_keys(command), VALUES), min_size=1, max_size=3))
    _check(client, command, extra)


@pytest.mark.parametrize("command", sorted(BASE))
def test_every_parameter_with_every_hostile_value(client, command):
    """The issue's eleven (400-digit sizes, inf, nan, seed=abc, tp=1e400, ...) and more, on every parameter."""
    for key in sorted(api.OPTIONS[command]):
        for value in HOSTILE:
            _check(client, command, [(key, value)])
