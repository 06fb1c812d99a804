"""The guard inside a cluster: as one replica's sidecar that a router scrapes (observed, predicted and
max(observed, predicted) usage beside the engine's own metrics; /readyz out at level 3), and as an Envoy external
processor over real gRPC on loopback, driven by a client that sends what Envoy sends (the generated protos of
xds-protos): headers, the buffered body, the response's headers, and the stream's end."""

from __future__ import annotations

import io
import json
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
grpc = pytest.importorskip("grpc")

from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue  # noqa: E402
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb  # noqa: E402
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kvbudget.guard.server import build_guard  # noqa: E402

# Llama-3.1-8B holds 131,072 bytes per token; a 1 GiB budget is 8,192 tokens (512 blocks of 16) per replica.
BUDGET = 2**30
TOKENS = 8192


def guard_for(urls, log=None, **kw):
    guard, _ = build_guard(urls, "vllm", model="llama-3.1-8b", kv_memory=BUDGET, max_model_len=TOKENS,
                           poll_interval=0.05, staleness=2.0, decision_log=log or io.StringIO(), **kw)
    return guard


def gauges(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition by name (labels dropped), parsed as a scraper parses it."""
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def settle():
    time.sleep(0.25)


def chat(max_tokens=None, n=None, content="hello"):
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if n is not None:
        body["n"] = n
    return body


# --- sidecar -----------------------------------------------------------------------------------------------------

def test_sidecar_forwards_untouched_and_publishes_the_usage_a_router_reads(fake_engine, serve):
    log = io.StringIO()
    guard = guard_for([fake_engine.url], log, sidecar=True)
    fake_engine.slow_answer = 1.0
    with serve(guard.app()) as side:
        fake_engine.usage = 0.75  # level 1: a guard would cap max_tokens
        settle()
        import threading

        answer = {}
        worker = threading.Thread(target=lambda: answer.update(r=httpx.post(
            f"{side.url}/v1/chat/completions", json=chat(max_tokens=300, n=2), timeout=20)))
        worker.start()
        time.sleep(0.5)  # the request is in flight: its prediction is held
        scraped = gauges(httpx.get(f"{side.url}/metrics").text)
        # the engine's own gauge, republished from a fresh scrape, beside the guard's
        assert scraped["vllm:kv_cache_usage_perc"] == 0.75
        # two sequences of (prompt + 300) tokens, as sent, in 16-token blocks, of 8,192 tokens
        predicted = scraped["kvbudget_guard_predicted_usage"]
        prompt = 1 + 8  # "hello": 5 characters / 4 rounded up, plus 8 for the message's template
        assert predicted == pytest.approx(2 * -(-(prompt + 300) // 16) * 16 / TOKENS)
        assert scraped["kvbudget_guard_observed_usage"] == 0.75
        assert scraped["kvbudget_guard_kv_usage"] == pytest.approx(max(0.75, predicted))
        worker.join()
        assert answer["r"].status_code == 200
        assert fake_engine.bodies[-1] == chat(max_tokens=300, n=2)  # untouched
        line = json.loads(log.getvalue().splitlines()[-1])
        assert line["action"] == "forward" and line["level"] == 1 and line["changes"] == []
        assert line["advice"] == "forward" and line["advised_changes"] == ["max_tokens 300->150"]
        after = gauges(httpx.get(f"{side.url}/metrics").text)
        assert after["kvbudget_guard_predicted_usage"] == 0 and after["kvbudget_guard_kv_usage"] == 0.75


def test_sidecar_readyz_is_out_at_level_3_and_back_below_the_hysteresis(fake_engine, serve):
    guard = guard_for([fake_engine.url], sidecar=True)
    with serve(guard.app()) as side:
        settle()
        assert httpx.get(f"{side.url}/readyz").status_code == 200
        fake_engine.usage = 0.96  # at or above 95%: level 3
        settle()
        assert httpx.get(f"{side.url}/readyz").status_code == 503
        # the sidecar still forwards what the router sends it (the router decides)
        assert httpx.post(f"{side.url}/v1/chat/completions", json=chat(max_tokens=5), timeout=20).status_code == 200
        # counted as what was done: forwarded, at level 3
        assert 'kvbudget_guard_decisions_total{action="forward",level="3"} 1.0' in httpx.get(f"{side.url}/metrics").text
        fake_engine.usage = 0.92  # below 95% but not below 95% - 5%: still level 3
        settle()
        assert httpx.get(f"{side.url}/readyz").status_code == 503
        assert gauges(httpx.get(f"{side.url}/metrics").text)["kvbudget_guard_level"] == 3
        fake_engine.usage = 0.5
        settle()
        assert httpx.get(f"{side.url}/readyz").status_code == 200


def test_sidecar_needs_exactly_one_upstream(fake_engine):
    from kvbudget import KVBudgetError

    with pytest.raises(KVBudgetError, match="a sidecar fronts exactly one engine replica"):
        guard_for([fake_engine.url, "http://127.0.0.1:9"], sidecar=True)


def test_full_guard_publishes_kv_usage_per_replica(fake_engine_class, serve):
    a, b = fake_engine_class(usage=0.3), fake_engine_class(usage=0.8)
    with serve(a.app()) as sa, serve(b.app()) as sb:
        guard = guard_for([sa.url, sb.url])
        with serve(guard.app()) as g:
            settle()
            text = httpx.get(f"{g.url}/metrics").text
            usage = {s.labels["replica"]: s.value for f in text_string_to_metric_families(text)
                     for s in f.samples if s.name == "kvbudget_guard_kv_usage"}
            assert usage == {sa.url: 0.3, sb.url: 0.8}
            assert "vllm:kv_cache_usage_perc" not in text  # only a sidecar republishes its engine's metrics


# --- Envoy external processor ----------------------------------------------------------------------------------

def headers_message(path="/v1/chat/completions", method="POST", extra=(), end_of_stream=False, raw=True):
    pairs = [(":path", path), (":method", method), (":authority", "gateway"), ("content-type", "application/json"),
             *extra]
    values = [HeaderValue(key=k, raw_value=v.encode()) if raw else HeaderValue(key=k, value=v) for k, v in pairs]
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=HeaderMap(headers=values),
                                                               end_of_stream=end_of_stream))


def body_message(body, end_of_stream=True):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=end_of_stream))


def response_headers_message():
    values = [HeaderValue(key=":status", raw_value=b"200")]
    return pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=HeaderMap(headers=values)))


class Envoy:
    """One HTTP exchange as Envoy's ext_proc filter runs it: a gRPC stream fed message by message."""

    def __init__(self, port: int):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.ExternalProcessorStub(self.channel)

    def exchange(self, *messages):
        """Send the messages and read one answer per message (an immediate response ends the stream early)."""
        import queue

        outbox: queue.Queue = queue.Queue()

        def requests():
            while (m := outbox.get()) is not None:
                yield m

        call = self.stub.Process(requests())
        answers = []
        for m in messages:
            outbox.put(m)
            answers.append(next(call))
            if answers[-1].WhichOneof("response") == "immediate_response":
                break
        return call, outbox, answers

    def close(self):
        self.channel.close()


def set_headers(mutation) -> dict[str, str]:
    return {h.header.key: (h.header.raw_value.decode() or h.header.value) for h in mutation.set_headers}


@pytest.fixture
def ext_proc(fake_engine, serve, free_port):
    """A guard in front of the fake engine serving ext_proc on a loopback port: (guard, HTTP url, Envoy, log)."""
    port = free_port()
    log = io.StringIO()
    guard = guard_for([fake_engine.url], log, ext_proc=("127.0.0.1", port))
    with serve(guard.app()) as g:
        envoy = Envoy(port)
        settle()
        yield guard, g.url, envoy, log
        envoy.close()


def test_ext_proc_levels_0_to_3(ext_proc, fake_engine):
    guard, url, envoy, log = ext_proc
    # level 0: headers continue, the body continues unchanged, the replica is named for an ORIGINAL_DST cluster
    call, outbox, answers = envoy.exchange(headers_message(), body_message(chat(max_tokens=100)),
                                           response_headers_message())
    assert answers[0].WhichOneof("response") == "request_headers"
    body = answers[1].request_body.response
    assert not body.HasField("body_mutation")
    port = fake_engine.url.rsplit(":", 1)[1]
    assert set_headers(body.header_mutation) == {"x-gateway-destination-endpoint": f"127.0.0.1:{port}",
                                                 "x-kvbudget-level": "0"}
    assert set_headers(answers[2].response_headers.response.header_mutation) == {"x-kvbudget-level": "0"}
    in_flight = gauges(httpx.get(f"{url}/metrics").text)["kvbudget_guard_predicted_usage"]
    assert in_flight == pytest.approx(-(-(9 + 100) // 16) * 16 / TOKENS)  # held while the exchange lasts
    outbox.put(None)  # the exchange is over: Envoy closes the stream
    with pytest.raises(StopIteration):
        next(call)
    time.sleep(0.1)
    assert gauges(httpx.get(f"{url}/metrics").text)["kvbudget_guard_predicted_usage"] == 0

    # level 1: max_tokens capped in the body, with its new length
    fake_engine.usage = 0.75
    settle()
    call, outbox, answers = envoy.exchange(headers_message(), body_message(chat(max_tokens=100)))
    common = answers[1].request_body.response
    rewritten = json.loads(common.body_mutation.body)
    assert rewritten["max_tokens"] == 50 and rewritten["messages"] == chat()["messages"]
    assert set_headers(common.header_mutation)["content-length"] == str(len(common.body_mutation.body))
    assert set_headers(common.header_mutation)["x-kvbudget-level"] == "1"
    outbox.put(None)

    # level 2: one sample
    fake_engine.usage = 0.9
    settle()
    call, outbox, answers = envoy.exchange(headers_message(), body_message(chat(max_tokens=100, n=4)))
    rewritten = json.loads(answers[1].request_body.response.body_mutation.body)
    assert rewritten["n"] == 1 and rewritten["max_tokens"] == 50
    outbox.put(None)

    # level 3: an immediate 503 with Retry-After, in the OpenAI error shape the proxy answers with
    fake_engine.usage = 0.97
    settle()
    call, outbox, answers = envoy.exchange(headers_message(), body_message(chat(max_tokens=100)))
    immediate = answers[1].immediate_response
    assert immediate.status.code == 503
    assert set_headers(immediate.headers)["retry-after"] == "5"
    error = json.loads(immediate.body)["error"]
    assert error["type"] == "server_overloaded" and error["message"].startswith("the KV cache is nearly full")
    outbox.put(None)

    # the same decision log and metrics as the proxy
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [(line["action"], line["level"]) for line in lines] == [("forward", 0), ("forward", 1), ("forward", 2),
                                                                   ("reject", 3)]
    metrics = httpx.get(f"{url}/metrics").text
    assert 'kvbudget_guard_decisions_total{action="reject",level="3"} 1.0' in metrics
    assert fake_engine.bodies == []  # the processor never forwards anything itself


def test_ext_proc_and_the_proxy_decide_alike(ext_proc, fake_engine):
    """The same request at the same usage: the proxy's forwarded body equals the processor's rewritten body."""
    guard, url, envoy, log = ext_proc
    fake_engine.usage = 0.9
    settle()
    request = chat(max_tokens=400, n=3)
    _, outbox, answers = envoy.exchange(headers_message(), body_message(request))
    outbox.put(None)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=20)
    client.chat.completions.create(**request)
    assert json.loads(answers[1].request_body.response.body_mutation.body) == fake_engine.bodies[-1]


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    ({"model": "m", "messages": "hi"}, 400, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, 400, "max_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "n"),
])
def test_ext_proc_malformed_bodies_are_answered_400(ext_proc, body, status, param):
    guard, url, envoy, log = ext_proc
    _, outbox, answers = envoy.exchange(headers_message(), body_message(body))
    outbox.put(None)
    immediate = answers[1].immediate_response
    assert immediate.status.code == status
    error = json.loads(immediate.body)["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_ext_proc_partial_body_old_header_values_and_other_paths(ext_proc):
    guard, url, envoy, log = ext_proc
    # a body Envoy did not buffer whole (BUFFERED_PARTIAL or STREAMED): refused, not judged on a fragment
    _, outbox, answers = envoy.exchange(headers_message(), body_message(b'{"model": "m", "mess', end_of_stream=False))
    outbox.put(None)
    assert answers[1].immediate_response.status.code == 413
    # Envoy before 1.27 sent header values in `value`, not `raw_value`
    _, outbox, answers = envoy.exchange(headers_message(raw=False), body_message(chat(max_tokens=10)))
    outbox.put(None)
    assert answers[1].request_body.response.header_mutation.set_headers  # judged: the replica named
    # another path passes untouched
    _, outbox, answers = envoy.exchange(headers_message("/v1/embeddings"), body_message({"input": "x"}))
    outbox.put(None)
    assert answers[1].request_body.response == pb.CommonResponse()  # continue, nothing changed
    _, outbox, answers = envoy.exchange(headers_message("/v1/models", "GET", end_of_stream=True))
    outbox.put(None)
    assert answers[0].request_headers.response == pb.CommonResponse()


def test_ext_proc_client_going_away_releases_and_garbage_does_not_stop_it(ext_proc, free_port):
    guard, url, envoy, log = ext_proc
    call, outbox, answers = envoy.exchange(headers_message(), body_message(chat(max_tokens=2000)))
    assert gauges(httpx.get(f"{url}/metrics").text)["kvbudget_guard_predicted_usage"] > 0.2
    call.cancel()  # the client (or Envoy) goes away mid-exchange
    deadline = time.time() + 5
    while gauges(httpx.get(f"{url}/metrics").text)["kvbudget_guard_predicted_usage"] != 0:
        assert time.time() < deadline, "the prediction of a request whose stream was cancelled was never released"
        time.sleep(0.05)
    # bytes that are not a ProcessingRequest: that stream fails, the processor goes on
    port = guard.config.ext_proc[1]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        raw = channel.stream_stream("/envoy.service.ext_proc.v3.ExternalProcessor/Process",
                                    request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError):
            list(raw(iter([b"\xff\xff\xff garbage"]), timeout=5))
    _, outbox, answers = envoy.exchange(headers_message(), body_message(chat(max_tokens=10)))
    outbox.put(None)
    assert answers[1].WhichOneof("response") == "request_body"
    assert httpx.get(f"{url}/healthz").status_code == 200


def test_cli_serves_ext_proc_and_sidecar(guard_process, fake_engine, free_port):
    """`kvbudget guard --ext-proc HOST:PORT` as a process: the processor answers beside the HTTP routes; a taken
    port is one line and exit 2; --sidecar with two upstreams is refused the same way."""
    import subprocess
    import sys

    port = free_port()
    with guard_process("--upstream", fake_engine.url, "--model", "llama-3.1-8b", "--kv-memory", "1GiB",
                       "--ext-proc", f"127.0.0.1:{port}") as (proc, url):
        envoy = Envoy(port)
        _, outbox, answers = envoy.exchange(headers_message(), body_message(chat(max_tokens=10)))
        outbox.put(None)
        envoy.close()
        assert set_headers(answers[1].request_body.response.header_mutation)["x-kvbudget-level"] == "0"
        taken = subprocess.run([sys.executable, "-m", "kvbudget", "guard", "--upstream", fake_engine.url,
                                "--listen", f"127.0.0.1:{free_port()}", "--ext-proc", f"127.0.0.1:{port}"],
                               capture_output=True, text=True, timeout=60)
        assert taken.returncode == 2 and taken.stderr.count("\n") == 1
        assert f"--ext-proc: cannot listen on 127.0.0.1:{port}" in taken.stderr
    two = subprocess.run([sys.executable, "-m", "kvbudget", "guard", "--sidecar", "--upstream", fake_engine.url,
                          "--upstream", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{free_port()}"],
                         capture_output=True, text=True, timeout=60)
    assert two.returncode == 2 and "a sidecar fronts exactly one engine replica" in two.stderr
    assert "Traceback" not in two.stderr


# --- the cluster guide's configurations ---------------------------------------------------------------------------

def readme_yaml_blocks() -> list[dict]:
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[3] / "docs" / "guides" / "cluster.md").read_text()
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def test_the_guides_envoy_config_is_a_valid_envoy_bootstrap():
    """Parsed with Envoy's own protos (xds-protos): a field misspelt or misplaced, or a wrong @type, fails."""
    import envoy.extensions.filters.http.ext_proc.v3.ext_proc_pb2 as ext_proc_config
    import envoy.extensions.filters.http.router.v3.router_pb2
    import envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 as hcm
    import envoy.extensions.upstreams.http.v3.http_protocol_options_pb2  # noqa: F401
    from envoy.config.bootstrap.v3.bootstrap_pb2 import Bootstrap
    from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
    from google.protobuf import json_format

    envoy_config = next(b for b in readme_yaml_blocks() if "static_resources" in b)
    bootstrap = json_format.ParseDict(envoy_config, Bootstrap())
    manager = hcm.HttpConnectionManager()
    bootstrap.static_resources.listeners[0].filter_chains[0].filters[0].typed_config.Unpack(manager)
    processor = ext_proc_config.ExternalProcessor()
    manager.http_filters[0].typed_config.Unpack(processor)
    # what the processor needs: the whole body in one message, and the response's headers for x-kvbudget-level
    assert processor.processing_mode.request_body_mode == ProcessingMode.BUFFERED
    assert processor.processing_mode.response_header_mode == ProcessingMode.SEND
    kvbudget_cluster, engines = bootstrap.static_resources.clusters
    from kvbudget.guard.extproc import ENDPOINT_HEADER

    assert engines.original_dst_lb_config.http_header_name == ENDPOINT_HEADER
    assert processor.grpc_service.envoy_grpc.cluster_name == kvbudget_cluster.name


def test_readme_router_config_reads_the_gauge_the_sidecar_exports():
    from kvbudget.guard.metrics import GuardMetrics

    picker = next(b for b in readme_yaml_blocks() if b.get("kind") == "EndpointPickerConfig")
    extractor = next(p for p in picker["plugins"] if p["type"] == "core-metrics-extractor")["parameters"]
    spec = extractor["engineConfigs"][0]["kvUsageSpec"]
    exported = {m.name for m in GuardMetrics().registry.collect()}
    assert spec in exported and spec == "kvbudget_guard_kv_usage"
    assert extractor["defaultEngine"] == extractor["engineConfigs"][0]["name"]
    names = {p.get("name", p["type"]) for p in picker["plugins"]}
    refs = {r["pluginRef"] for prof in picker["schedulingProfiles"] for r in prof["plugins"]}
    sources = {s["pluginRef"] for s in picker["dataLayer"]["sources"]}
    extractors = {e["pluginRef"] for s in picker["dataLayer"]["sources"] for e in s["extractors"]}
    assert refs | sources | extractors <= names and picker["flowControl"]["saturationDetector"]["pluginRef"] in names


def test_readme_router_config_has_llm_d_router_v0_10s_layout():
    """The fields of llm-d-router v0.10.0's EndpointPickerConfig and FlowControlConfig (apix/config/v1alpha1/
    endpointpickerconfig_types.go, their json tags), without the two it deprecates: the top-level
    saturationDetector (moved under flowControl in v0.9) and parser; its own API group (the old one loads with a
    deprecation warning: pkg/epp/config/loader/configloader.go)."""
    picker = next(b for b in readme_yaml_blocks() if b.get("kind") == "EndpointPickerConfig")
    top = {"apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles", "dataLayer", "flowControl",
           "requestHandler"}
    flow = {"maxBytes", "maxRequests", "defaultRequestTTL", "defaultPriorityBand", "defaultNegativePriorityBand",
            "priorityBands", "usageLimitPolicyPluginRef", "saturationDetector", "enableEviction"}
    assert set(picker) <= top and set(picker["flowControl"]) <= flow
    assert picker["apiVersion"] == "llm-d.ai/v1alpha1" and "flowControl" in picker["featureGates"]
