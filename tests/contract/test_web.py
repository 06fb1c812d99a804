"""`kvbudget web`'s API: each answer is what the CLI's --json prints for the same arguments; nothing a request
sends reads the server's files, and every limit answers with a one-line error naming its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from kvbudget.cli import main
from kvbudget.traces import find as bundled_trace
from kvbudget.web import api
from kvbudget.web.app import create_app

LOGS = Path(__file__).parents[1] / "data" / "logs"
TRACES = Path(bundled_trace("azure-conv-2023").path).parent  # the traces bundled in the package


@pytest.fixture
def client(tmp_path):
    return TestClient(create_app(upload_dir=tmp_path / "uploads"))


def cli_json(argv, capsys):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def cli_error(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvbudget: error: ") and err.count("\n") == 1
    return err.removeprefix("kvbudget: error: ").strip()


SAME = [  # (endpoint, query, the CLI's arguments)
    ("estimate", "model=llama-3.1-8b&engine=vllm&context=4096,32k&batch=1,8",
     ["estimate", "llama-3.1-8b", "--engine", "vllm", "--context", "4096,32k", "--batch", "1,8"]),
    ("estimate", "model=gemma-2-9b&engine=llamacpp&kv_dtype=q8_0&kv_memory=8GiB",
     ["estimate", "gemma-2-9b", "--engine", "llamacpp", "--kv-dtype", "q8_0", "--kv-memory", "8GiB"]),
    ("estimate", "model=deepseek-v3&engine=vllm&tp=8&no_prefix_caching=1",
     ["estimate", "deepseek-v3", "--engine", "vllm", "--tp", "8", "--no-prefix-caching"]),
    ("plan", "model=llama-3.1-8b&gpu=L4&max_model_len=32k&concurrency=4",
     ["plan", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "32k", "--concurrency", "4"]),
    ("plan", "model=qwen3-next-80b-a3b&engine=vllm&gpu=H100-80GB&tp=4&kv_dtype=fp8",
     ["plan", "qwen3-next-80b-a3b", "--engine", "vllm", "--gpu", "H100-80GB", "--tp", "4", "--kv-dtype", "fp8"]),
    ("plan", "model=llama-3.1-70b&gpu=L4",  # no KV budget: the answer with its changes
     ["plan", "llama-3.1-70b", "--gpu", "L4"]),
    ("plan", "model=mistral-7b&engine=sglang&gpu_memory=24GiB",
     ["plan", "mistral-7b", "--engine", "sglang", "--gpu-memory", "24GiB"]),
    ("compare", "model=llama-3.1-8b&model=mistral-7b&model=qwen3-8b&gpu=H100-80GB&context=32k",
     ["compare", "llama-3.1-8b", "mistral-7b", "qwen3-8b", "--gpu", "H100-80GB", "--context", "32k"]),
    ("simulate", "model=llama-3.1-8b&gpu=L4&rate=4&requests=300&seed=3&max_model_len=16k",
     ["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "4", "--requests", "300", "--seed", "3",
      "--max-model-len", "16k"]),
    ("simulate", "model=llama-3.1-8b&engine=vllm@0.10&gpu=A100-80GB&rate=4&requests=100&max_model_len=8k",
     ["simulate", "llama-3.1-8b", "--engine", "vllm@0.10", "--gpu", "A100-80GB", "--rate", "4", "--requests", "100",
      "--max-model-len", "8k"]),
]


@pytest.mark.parametrize("endpoint, query, argv", SAME, ids=[f"{e}-{i}" for i, (e, _, _) in enumerate(SAME)])
def test_each_answer_is_the_clis_json(client, capsys, endpoint, query, argv):
    r = client.get(f"/api/{endpoint}?{query}")
    assert r.status_code == 200, r.text
    assert r.json() == cli_json(argv, capsys)


def test_a_bundled_trace_simulates_as_the_cli_does_on_its_file(client, capsys):
    r = client.get("/api/simulate?model=llama-3.1-8b&gpu=L4&trace=azure-code-2023&slice=0:400&max_model_len=16k")
    assert r.status_code == 200, r.text
    assert r.json() == cli_json(["simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "16k", "--slice",
                                 "0:400", "--trace", str(TRACES / "AzureLLMInferenceTrace_code.csv")], capsys)


def test_the_guard_in_front_is_the_plans_guard(client, capsys, tmp_path):
    """guard=1: the guard YAML `plan --guard-config` writes for the same settings, then `simulate --guard-config`."""
    query = "model=llama-3.1-8b&gpu=L4&max_model_len=16k&trace=azure-conv-2023&slice=0:600"
    r = client.get(f"/api/simulate?{query}&guard=1")
    assert r.status_code == 200, r.text
    config = tmp_path / "guard.yaml"
    assert main(["plan", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "16k", "--guard-config", str(config)]) == 0
    capsys.readouterr()
    expected = cli_json(["simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "16k", "--slice", "0:600",
                         "--trace", str(TRACES / "AzureLLMInferenceTrace_conv.csv"), "--guard-config", str(config)],
                        capsys)
    assert r.json() == expected and expected["guard"]["rejected"] + sum(expected["guard"]["forwarded"].values()) > 0
    download = client.get("/api/guard.yaml?model=llama-3.1-8b&gpu=L4&max_model_len=16k")
    assert download.status_code == 200 and download.text == config.read_text()
    assert "attachment" in download.headers["content-disposition"]


@pytest.mark.parametrize("query, argv, field", [
    ("model=llama-3.1-8b&tp=x", ["estimate", "llama-3.1-8b", "--tp", "x"], "tp"),
    ("model=llama-3.1-8b&engine=vllm&kv_dtype=q4_0", ["estimate", "llama-3.1-8b", "--engine", "vllm",
                                                      "--kv-dtype", "q4_0"], "kv_dtype"),
    ("model=no-such-model-xyz", ["estimate", "no-such-model-xyz"], "model"),
    ("model=llama-3.1-8b&device=tpu", ["estimate", "llama-3.1-8b", "--device", "tpu"], "device"),
    ("model=llama-3.1-8b&context=0", ["estimate", "llama-3.1-8b", "--context", "0"], "context"),
])
def test_errors_are_the_clis_line_and_name_their_field(client, capsys, monkeypatch, query, argv, field):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = client.get(f"/api/estimate?{query}")
    assert r.status_code == 400
    body = r.json()
    assert body["field"] == field
    if field != "device":  # the API checks choices itself, before the parser's longer wording
        assert body["error"] == cli_error(argv, capsys)
    assert "\n" not in body["error"] and "Traceback" not in body["error"]


def test_plan_errors_name_gpu_fields(client):
    body = client.get("/api/plan?model=llama-3.1-8b&gpu=H900").json()
    assert body["field"] == "gpu" and "H900" in body["error"]
    body = client.get("/api/plan?model=llama-3.1-8b&gpu_memory=lots").json()
    assert body["field"] == "gpu_memory"


@pytest.mark.parametrize("model", ["/etc/passwd", "~/.ssh/id_rsa", "../../etc/hosts", "tests/data/logs/x.json",
                                   "./config.json", "C:\\Windows\\win.ini"])
def test_no_request_names_a_server_file(client, model):
    r = client.get("/api/estimate", params={"model": model})
    assert r.status_code == 400 and r.json()["field"] == "model"
    assert "not the server's files" in r.json()["error"]


def test_a_relative_path_that_exists_is_not_read(client, monkeypatch, tmp_path, capsys):
    """A name that happens to be a model folder of the server's (here ./confined with a config.json) is read by the
    CLI but, from the page, only looked up as a catalog name or Hub id."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "confined").mkdir()
    (tmp_path / "confined" / "config.json").write_text((LOGS / "gpt-oss-swa.config.json").read_text())
    assert main(["estimate", "confined", "--json"]) == 0  # the CLI reads the folder
    capsys.readouterr()
    r = client.get("/api/estimate?model=confined")
    assert r.status_code == 400 and "catalog" in r.json()["error"]  # the page does not
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    (tmp_path / "org" / "name" / "config.json").write_text((LOGS / "gpt-oss-swa.config.json").read_text())
    r = client.get("/api/estimate?model=org/name")  # Hub-id-shaped: looked up on the Hub (offline here)
    assert r.status_code == 400 and "Hub" in r.json()["error"]


def test_unknown_and_file_parameters_are_refused(client):
    for query in ("model=llama-3.1-8b&prompt_file=/etc/passwd", "model=llama-3.1-8b&plot=/tmp/x.png",
                  "model=llama-3.1-8b&bogus=1"):
        r = client.get(f"/api/plan?{query}")
        assert r.status_code == 400 and r.json()["error"].startswith("unknown parameter"), query
    r = client.get("/api/simulate?model=llama-3.1-8b&rate=1&trace_file=/etc/passwd")
    assert r.status_code == 400
    r = client.get("/api/simulate?model=llama-3.1-8b&gpu=L4&trace=/etc/passwd")
    assert r.status_code == 400 and r.json()["field"] == "trace"
    r = client.get("/api/plan?model=llama-3.1-8b&tp=1&tp=2")
    assert r.status_code == 400 and r.json()["field"] == "tp"


def test_an_uploaded_config_is_a_model(client, capsys):
    text = (LOGS / "gpt-oss-swa.config.json").read_bytes()
    r = client.post("/api/upload?kind=model&name=gpt-oss-swa.config.json", content=text)
    assert r.status_code == 200, r.text
    ref = r.json()["id"]
    assert ref.startswith("upload:model-") and r.json()["model"]["model_type"] == "gpt_oss"
    got = client.get(f"/api/estimate?model={ref}&engine=vllm&context=8192").json()
    want = cli_json(["estimate", str(LOGS / "gpt-oss-swa.config.json"), "--engine", "vllm", "--context", "8192"],
                    capsys)
    assert {k: v for k, v in got.items() if k not in ("source", "model")} == \
        {k: v for k, v in want.items() if k not in ("source", "model")}
    assert client.get("/api/estimate?model=upload:model-000000000000000000000000.json").json()["field"] == "model"


def test_a_bad_config_upload_says_why_next_to_the_model(client, capsys, tmp_path):
    bad = json.loads((LOGS / "gpt-oss-swa.config.json").read_text())
    del bad["num_hidden_layers"]
    r = client.post("/api/upload?kind=model&name=bad.json", content=json.dumps(bad).encode())
    assert r.status_code == 400 and r.json()["field"] == "model"
    assert r.json()["error"].startswith("bad.json: ") and str(tmp_path) not in r.json()["error"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    assert "num_hidden_layers" in r.json()["error"] and "num_hidden_layers" in cli_error(["estimate", str(path)],
                                                                                         capsys)
    r = client.post("/api/upload?kind=model&name=notes.txt", content=b"hello")
    assert r.status_code == 400 and ".json or .gguf" in r.json()["error"]
    r = client.post("/api/upload?kind=model&name=x.json", content=b"{not json")
    assert r.status_code == 400 and "invalid JSON" in r.json()["error"]


def test_upload_limits(tmp_path):
    limits = api.Limits(config_bytes=1000, uploads=3)
    client = TestClient(create_app(upload_dir=tmp_path / "u", limits=limits))
    r = client.post("/api/upload?kind=model&name=big.json", content=b" " * 1001)
    assert r.status_code == 413 and "larger than" in r.json()["error"]
    config = (LOGS / "llama-gqa.config.json").read_text()
    for i in range(5):  # distinct files; only the newest 3 stay
        text = config.replace('"vocab_size"', f'"_n": {i}, "vocab_size"')
        assert client.post("/api/upload?kind=model&name=c.json", content=text.encode()).status_code == 200
    assert len(list((tmp_path / "u").glob("model-*"))) == 3
    long = "x" * 9000
    assert client.get(f"/api/estimate?model=llama-3.1-8b&q={long}").status_code == 414


def test_a_gguf_header_is_enough(client):
    """The page sends a GGUF's first bytes and its size: the header read from them is the whole file's."""
    from kvbudget.model.gguf import read_gguf
    from kvbudget.quality.load import bundled_gguf

    path = bundled_gguf()
    head = path.read_bytes()[:4 * 1024 * 1024]
    r = client.post("/api/upload?kind=model&name=smollm2.gguf", content=head,
                    headers={"X-File-Size": str(path.stat().st_size)})
    assert r.status_code == 200, r.text
    assert r.json()["model"]["layers"] == read_gguf(path)[0]["num_hidden_layers"] == 30
    got = client.get(f"/api/estimate?model={r.json()['id']}&engine=llamacpp&context=2048").json()
    assert got["bytes_per_token"] == 30 * 2 * 3 * 64 * 2  # 30 layers, K and V, 3 KV heads of 64, f16
    r = client.post("/api/upload?kind=model&name=smollm2.gguf", content=head)
    assert r.status_code == 400 and "X-File-Size" in r.json()["error"]


def test_a_quality_report_is_checked(client):
    report = {"model": "m", "context": 256, "data": ["a.txt"], "matmul": "fp32", "results": [
        {"variant": "f16", "tokens": 512, "windows": 2, "kl_mean": 0.0, "top1_agreement": 1.0,
         "perplexity_change": 0.0}], "verdict": "v", "notes": []}
    r = client.post("/api/upload?kind=report&name=q.json", content=json.dumps(report).encode())
    assert r.status_code == 200, r.text
    assert client.get(f"/api/quality?report={r.json()['id']}").json() == report
    del report["results"][0]["kl_mean"]
    r = client.post("/api/upload?kind=report&name=q.json", content=json.dumps(report).encode())
    assert r.status_code == 400 and "results[0].kl_mean" in r.json()["error"]


def test_simulations_are_limited(tmp_path):
    client = TestClient(create_app(upload_dir=tmp_path, limits=api.Limits(simulate_requests=1500)))
    r = client.get("/api/simulate?model=llama-3.1-8b&gpu=L4&rate=5&requests=2000")
    assert r.status_code == 400 and r.json()["field"] == "requests"
    r = client.get("/api/simulate?model=llama-3.1-8b&gpu=L4&trace=azure-conv-2023&max_model_len=16k")
    assert r.status_code == 400 and r.json()["field"] == "slice" and "1,500" in r.json()["error"]
    client = TestClient(create_app(upload_dir=tmp_path, limits=api.Limits(simulate_seconds=0.0)))
    r = client.get("/api/simulate?model=llama-3.1-8b&gpu=L4&trace=azure-conv-2023&slice=0:3000&max_model_len=16k")
    assert r.status_code == 400 and "limit" in r.json()["error"]


def test_the_page_and_its_files(client):
    page = client.get("/")
    assert page.status_code == 200 and "<title>kvbudget" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "https://" not in page.text  # nothing from a CDN: the page works offline
    script = client.get("/static/app.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert "https://" not in script.text and "http://" not in script.text.replace("http://www.w3.org/2000/svg", "")
    assert client.get("/static/../api.py").status_code == 404
    assert client.get("/static/index.html").status_code == 404
    choices = client.get("/api/choices").json()
    assert "llama-3.1-8b" in [m["name"] for m in choices["models"]] and "vllm" in choices["engines"]
    assert [t["name"] for t in choices["traces"]] == ["azure-conv-2023", "azure-code-2023", "mooncake-conv"]
    # the chart's engines are the registry's servers; every KV dtype listed is one the requests take
    from kvbudget.commands.estimate import EstimateRequest
    from kvbudget.commands.options import options
    from kvbudget.engines import serving_engines

    assert choices["chart_engines"] == [e.name for e in serving_engines()] and "hf" not in choices["chart_engines"]
    taken = next(opt.choices for name, _, opt in options(EstimateRequest) if name == "kv_dtype")
    assert taken is not None and all(d in taken for d in choices["kv_dtypes"])
    assert all(alias in taken for alias in ("float16", "FP8", "half", "e5m2")) and "nope" not in taken
    refused = client.get("/api/estimate?model=llama-3.1-8b&kv_dtype=nope")
    assert refused.status_code == 400 and "\n" not in refused.json()["error"]


def test_a_loopback_server_answers_only_loopback_names(tmp_path):
    client = TestClient(create_app(upload_dir=tmp_path, allowed_hosts=["127.0.0.1", "localhost"]),
                        base_url="http://127.0.0.1")
    assert client.get("/api/choices").status_code == 200
    assert client.get("/api/choices", headers={"host": "attacker.example"}).status_code == 400


def test_the_page_offers_the_bundled_traces_by_name_and_nothing_else(tmp_path):
    from kvbudget.simulation import read_trace

    for name, requests in (("azure-conv-2023", 19_366), ("azure-code-2023", 8_819), ("mooncake-conv", 12_031)):
        path = api.trace_path(name, None)  # type: ignore[arg-type]
        assert path.is_file() and sum(1 for _ in read_trace(path)) == requests
    for bad in ("AzureLLMInferenceTrace_conv.csv", "../gpus.json", str(TRACES / "AzureLLMInferenceTrace_conv.csv")):
        with pytest.raises(api.WebError, match="trace: .* is not one of azure-conv-2023"):
            api.trace_path(bad, None)  # type: ignore[arg-type]


def test_web_command_refuses_a_bad_address(capsys):
    assert cli_error(["web", "--listen", "localhost"], capsys).startswith("--listen: 'localhost' is not HOST:PORT")
    assert cli_error(["web", "--listen", "127.0.0.1:99999"], capsys).startswith("--listen")


def test_the_page_takes_no_option_that_names_a_file_of_the_server():
    """An option that reads or writes a file (metavar FILE) is the command line's alone: on the page it would read
    or write the server's files (simulate's prometheus_series once did)."""
    from kvbudget.commands.options import options
    from kvbudget.web import api

    for command, request in api.REQUESTS.items():
        for name, _, opt in options(request):
            if opt.metavar and "FILE" in opt.metavar.upper():
                assert name not in api.OPTIONS[command], (command, name)


@pytest.mark.parametrize("content, words", [
    (b'{"model": ' + b"[" * 100_000, "nests [ and { more than 64 levels deep"),
    (b'{"model": "m", "context": ' + b"9" * 5000 + b"}", "invalid JSON: a number of over 4,300 digits"),
    (b'{"model": "\xff\xfe"}', "not UTF-8 text"),
])
def test_a_hostile_quality_report_is_refused_in_the_readers_words(client, content, words):
    """A report is read as every JSON file is (kvbudget.files): one 400 next to the report saying what is wrong
    with it, never the parser's exception or the server's path."""
    r = client.post("/api/upload?kind=report&name=q.json", content=content)
    assert r.status_code == 400 and r.json()["field"] == "report", r.text
    assert words in r.json()["error"] and "/" not in r.json()["error"].replace("upload:", ""), r.text
