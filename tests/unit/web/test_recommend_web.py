"""`recommend` on the web page: /api/recommend answers what `kvbudget recommend --json` prints (and the chosen
deployment's files), /api/recommend.zip holds exactly the files `--out` writes, the page's stricter limits answer
in one line before any search, and an objective none meets is an answer that names what binds."""

from __future__ import annotations

import asyncio
import io
import json
import zipfile
from urllib.parse import urlencode

import pytest
from starlette.testclient import TestClient

from kvbudget.cli import main
from kvbudget.errors import KVBudgetError
from kvbudget.web import api
from kvbudget.web import recommend as search
from kvbudget.web.app import create_app

# a small search: two candidates (one H100, one L40S), 20 synthetic requests
ASK = {"model": "llama-3.1-8b", "rate": "2", "requests": "20", "prompt_tokens": "512", "output_tokens": "64",
       "slo": "ttft_p99=2s,tpot_p99=50ms", "gpus": "H100-80GB,L40S", "gpu_price": "H100-80GB=2.49,L40S=0.86",
       "max_gpus": "1", "tp": "1", "kv_dtype": "auto"}


def _flags(ask: dict[str, str]) -> list[str]:
    return [ask["model"], *(x for k, v in ask.items() if k != "model" for x in (f"--{k.replace('_', '-')}", v))]


def _get(client: TestClient, path: str, **changed: str | None):
    ask = {k: v for k, v in {**ASK, **changed}.items() if v is not None}
    return client.get(f"/api/{path}?{urlencode(ask)}")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    return TestClient(create_app(upload_dir=tmp_path_factory.mktemp("uploads")))


@pytest.fixture(scope="module")
def answered(client):
    r = _get(client, "recommend")
    assert r.status_code == 200, r.text
    return r.json()


def test_the_answer_is_the_clis_json_with_the_files(answered, capsys):
    assert main(["recommend", *_flags(ASK), "--json", "--backend", "serial"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in answered.items() if k != "files"} == cli
    assert answered["best"]["label"] == "1 x L40S"  # the cheaper GPU meets these objectives at 2 requests/s
    assert answered["candidates"] == {"listed": 2, "pruned": 0, "simulated": 2, "skipped": 0}
    names = [f["name"] for f in answered["files"]]
    assert {"serve.sh", "guard.yaml", "alerts.yaml", "README.md", "deployment.json"} <= set(names)
    assert all(f["text"] and f["what"] and f["apply"] for f in answered["files"])


def test_the_zip_holds_exactly_the_files_out_writes(client, answered, tmp_path, capsys):
    r = _get(client, "recommend.zip")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/zip"
    assert r.headers["content-disposition"] == 'attachment; filename="deployment.zip"'
    with zipfile.ZipFile(io.BytesIO(r.content)) as archive:
        zipped = {name: archive.read(name).decode() for name in archive.namelist()}
    out = tmp_path / "chosen"
    assert main(["recommend", *_flags(ASK), "--backend", "serial", "--out", str(out)]) == 0
    capsys.readouterr()
    assert zipped == {p.name: p.read_text() for p in out.iterdir()}
    assert zipped == {f["name"]: f["text"] for f in answered["files"]}  # the answer shows the same texts


def test_the_files_are_deploy_files_of_the_chosen_deployment(answered):
    """What kvbudget.deploy.files writes for the deployment the search chose, each pool as simulated."""
    from kvbudget.commands.recommend import RecommendRequest, prepared, recommendation
    from kvbudget.deploy import files
    from kvbudget.model.weights import model_weights

    ask = RecommendRequest(**{**{k: v for k, v in ASK.items()}, "backend": "serial"})
    ready = prepared(ask)
    found = recommendation(ask, ready)
    deployment = found.deployment()
    setup = found.setups[found.best.candidate.setting]
    expected = files(deployment, {p.role: setup for p in deployment.pools}, model_weights(ready.ask.model).total_bytes)
    shown = {f["name"]: f["text"] for f in answered["files"]}
    assert {f.name: f.text for f in expected} == {k: v for k, v in shown.items() if k != "deployment.json"}
    assert json.loads(shown["deployment.json"])["pools"][0]["gpu"] == "L40S"


def test_the_download_does_not_search_again(tmp_path, monkeypatch):
    calls = []
    real = search.recommend
    monkeypatch.setattr(search, "recommend", lambda *a: calls.append(1) or real(*a))
    client = TestClient(create_app(upload_dir=tmp_path))
    assert _get(client, "recommend").status_code == 200
    assert _get(client, "recommend.zip").status_code == 200
    assert calls == [1]


@pytest.mark.parametrize(("changed", "field", "words"), [
    ({"max_gpus": "9"}, "max_gpus", "max_gpus: at most 8 on this page"),
    ({"requests": "2001"}, "requests", "requests: at most 2,000 on this page"),
    ({"requests": "9" * 5000}, "requests", "requests: at most 2,000 on this page"),
    ({"rate": None, "requests": None, "trace": "azure-conv-2023", "slice": "0:2001"}, "slice",
     "slice: the traffic holds 2,001 requests, more than the 2,000"),
    ({"max_gpus": "8", "tp": "1,2,4,8", "kv_dtype": "auto,fp8"}, "max_gpus",
     "max_gpus: the search space holds 200 candidates, more than the 100 this page searches"),
])
def test_the_pages_limits_answer_in_one_line_before_the_search(client, changed, field, words):
    r = _get(client, "recommend", **changed)
    assert r.status_code == 400
    body = r.json()
    assert body["field"] == field and body["error"].startswith(words) and "\n" not in body["error"]


@pytest.mark.parametrize("name", ["backend", "out", "json", "force"])
def test_what_touches_the_servers_files_or_cores_is_not_a_parameter(client, name):
    r = _get(client, "recommend", **{name: "process" if name == "backend" else "1"})
    assert r.status_code == 400
    assert r.json()["field"] == name and r.json()["error"].startswith(f"unknown parameter '{name}' for recommend")


def test_a_search_past_its_time_is_a_400_that_says_what_to_do(tmp_path):
    client = TestClient(create_app(upload_dir=tmp_path, limits=api.Limits(recommend_seconds=0.0)))
    r = _get(client, "recommend")
    assert r.status_code == 400
    assert r.json() == {"field": "max_gpus", "error": (
        "recommend: the search ran past the page's 0 s limit; search fewer candidates (fewer GPUs, max_gpus, tp or "
        "kv_dtype values) or fewer requests (slice), or run `kvbudget recommend` yourself")}


def test_one_search_at_a_time_the_next_is_told_to_retry():
    work = api.Work(api.Limits())

    async def both() -> None:
        async with work.slot(search=True):
            with pytest.raises(api.WebError) as second:
                async with work.slot(search=True):
                    pass
            assert second.value.status == 503 and "1 search(es), its limit" in str(second.value)
        async with work.slot(search=True):  # free again
            pass

    asyncio.run(both())


def test_a_search_holds_a_simulations_slot_too():
    work = api.Work(api.Limits(simulations_at_once=1))

    async def both() -> None:
        async with work.slot(search=True):
            with pytest.raises(api.WebError) as simulation:
                async with work.slot(simulation=True):
                    pass
            assert simulation.value.status == 503

    asyncio.run(both())


@pytest.mark.parametrize(("changed", "field"), [
    ({"slo": "ttft_p99=2x"}, "slo"), ({"slo": ""}, "slo"), ({"gpus": "H100-80GB,B999"}, "gpus"),
    ({"gpu_price": "H100-80GB=2.49"}, "gpu_price"), ({"tp": "0"}, "tp"), ({"kv_dtype": "fp7"}, "kv_dtype"),
    ({"model": "/etc/passwd"}, "model"), ({"trace": "nope"}, "trace"),
])
def test_bad_input_is_one_line_next_to_its_field(client, changed, field):
    r = _get(client, "recommend", **changed)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["field"] == field and body["error"] and "\n" not in body["error"] and "Traceback" not in body["error"]


def test_objectives_none_meets_answer_what_binds_and_the_closest(client):
    r = _get(client, "recommend", slo="ttft_p99=1ms")
    assert r.status_code == 200
    body = r.json()
    assert body["best"] is None and body["files"] == []
    assert body["binding"].startswith("ttft_p99 ") and "> 1 ms (closest: 1 x " in body["binding"]
    z = _get(client, "recommend.zip", slo="ttft_p99=1ms")
    assert z.status_code == 400
    assert z.json() == {"field": "slo", "error": "slo: no candidate meets it, so there is no deployment to write: "
                                                 + body["binding"]}


def test_the_search_controls_come_from_the_commands_options(client):
    form = client.get("/api/choices").json()["recommend"]
    names = [o["name"] for o in form]
    assert names[0] == "slo" and form[0]["required"]
    assert {"gpus", "max_gpus", "tp", "kv_dtype", "gpu_price", "no_disagg", "exhaustive"} <= set(names)
    assert not {"backend", "out", "json", "force", "model", "trace", "rate"} & set(names)  # elsewhere, or not at all
    switch = next(o for o in form if o["name"] == "no_disagg")
    assert switch["switch"] and switch["default"] is None


def test_a_check_ends_a_search_and_needs_the_serial_backend():
    from kvbudget.commands.recommend import RecommendRequest, prepared, recommendation

    ask = RecommendRequest(**{**ASK, "rate": "50", "requests": "400"}, backend="serial")  # runs of many steps
    ready = prepared(ask)
    calls = []

    def check() -> None:  # called within a run: no progress is given, so none between runs
        calls.append(1)
        raise KVBudgetError("stop", param="slo")

    with pytest.raises(KVBudgetError, match="^stop$"):
        recommendation(ask, ready, check=check)
    assert calls == [1]
    with pytest.raises(KVBudgetError) as process:
        recommendation(RecommendRequest(**ASK, backend="process"), ready, check=lambda: None)
    assert process.value.param == "backend"

