"""`kvbudget web` in a real headless Chromium (Debian's `chromium` and `chromium-driver`, driven by Selenium):
what people do on the page, checked against the API's answers. Screenshots go to artifacts/screenshots/ (or
$KVBUDGET_ARTIFACTS) for a person to look at. Run with `pytest -m browser tests/browser`; `.ci/run` installs
what it needs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from kvbudget.units import format_bytes

pytestmark = pytest.mark.browser

ROOT = Path(__file__).parents[2]
SHOTS = Path(os.environ.get("KVBUDGET_ARTIFACTS", ROOT / "artifacts")) / "screenshots"
LOGS = ROOT / "tests" / "data" / "logs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import uvicorn

    from kvbudget.web.app import create_app

    port = _free_port()
    app = create_app(upload_dir=tmp_path_factory.mktemp("uploads"), allowed_hosts=["127.0.0.1", "localhost"])
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary = os.environ.get("KVBUDGET_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = os.environ.get("KVBUDGET_CHROMEDRIVER") or shutil.which("chromedriver")
    assert binary and driver_path, "install Debian's chromium and chromium-driver (apt-get install chromium " \
                                   "chromium-driver), as .ci/run does"
    options = Options()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--lang=en-US"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


def api(server: str, endpoint: str, query: str) -> dict:
    with urllib.request.urlopen(f"{server}/api/{endpoint}?{query}") as r:
        return json.loads(r.read())


def settle(browser, what: str = "#results[aria-busy='false']", timeout: float = 60) -> None:
    """Wait for the page to finish answering (and for `what` to be there)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    time.sleep(0.4)  # the page waits 250 ms after a change before asking
    WebDriverWait(browser, timeout).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, what)
        and d.find_element(By.ID, "results").get_attribute("aria-busy") == "false")


def shot(browser, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    width = browser.get_window_size()["width"]
    browser.set_window_size(width, min(max(height + 160, 600), 6000))
    path = SHOTS / f"{name}.png"
    browser.save_screenshot(str(path))
    browser.set_window_size(width, 1000)
    return path


def value(browser, key: str) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.CSS_SELECTOR, f"[data-value='{key}']").text


def set_field(browser, element_id: str, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    e = browser.find_element(By.ID, element_id)
    e.send_keys(Keys.CONTROL, "a")
    e.send_keys(Keys.DELETE)
    e.send_keys(text)


def choose(browser, element_id: str, option: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, element_id)).select_by_value(option)


def test_choose_model_gpu_engine_and_see_the_apis_numbers(server, browser):
    """Pick a model, GPU and engine with the controls: the cards show the API's plan, formatted as the CLI does."""
    browser.get(server + "/")
    settle(browser, "[data-value='kv_memory_bytes']")
    set_field(browser, "model", "qwen3-8b")
    choose(browser, "gpu", "L4")
    choose(browser, "engine", "sglang")
    set_field(browser, "max_model_len", "16k")
    settle(browser, "#kv-chart svg")
    plan = api(server, "plan", "model=qwen3-8b&gpu=L4&engine=sglang&max_model_len=16k&tp=1&pp=1&kv_dtype=auto"
                               "&concurrency=1")
    assert value(browser, "kv_memory_bytes") == format_bytes(plan["kv_memory_bytes"])
    assert value(browser, "max_concurrency") == f"{plan['capacity']['max_concurrency']:.2f}x"
    assert value(browser, "kv_cache_tokens") == f"{plan['capacity']['kv_cache_tokens']:,} tokens"
    assert value(browser, "bytes_per_token") == f"{format_bytes(plan['bytes_per_token'])} / token"
    assert "qwen3-8b on L4" in browser.find_element("css selector", "#view-plan h2").text
    # one line per engine in the chart, and each engine's budget line
    series = {e.get_attribute("data-series") for e in browser.find_elements("css selector", "#kv-chart path")}
    assert {"vllm", "sglang", "llamacpp", "tgi"} <= series
    assert browser.find_elements("css selector", "#kv-chart line[data-budget='sglang']")
    shot(browser, "plan-qwen3-8b-L4-sglang")


def test_a_control_changes_the_numbers(server, browser):
    browser.get(server + "/?view=plan&model=llama-3.1-8b&engine=vllm&gpu=L4&max_model_len=32k&concurrency=4")
    settle(browser, "[data-value='kv_memory_bytes']")
    before = value(browser, "kv_memory_bytes"), value(browser, "max_concurrency")
    set_field(browser, "tp", "2")
    settle(browser, "#kv-chart svg")
    after = value(browser, "kv_memory_bytes"), value(browser, "max_concurrency")
    plan = api(server, "plan", "model=llama-3.1-8b&engine=vllm&gpu=L4&max_model_len=32k&concurrency=4&tp=2")
    assert after != before
    assert after == (format_bytes(plan["kv_memory_bytes"]), f"{plan['capacity']['max_concurrency']:.2f}x")
    assert "tp=2" in browser.current_url
    # a recommendation applied with its button becomes the controls' state and the link's
    first = browser.find_element("css selector", "#recommendations li")
    key, _, rest = first.find_element("css selector", "strong").text.partition("=")
    wanted = rest.split(" ")[0]
    first.find_element("css selector", "button").click()
    settle(browser, "#kv-chart svg")
    assert browser.find_element("id", key).get_attribute("value") == wanted
    assert f"{key}={wanted}" in urllib.parse.unquote(browser.current_url)


def test_a_shared_link_gives_the_same_view(server, browser):
    browser.get(server + "/?view=plan&model=mistral-7b&engine=llamacpp&gpu=RTX-4090&max_model_len=32k"
                         "&concurrency=2&kv_dtype=q8_0")
    settle(browser, "#kv-chart svg")
    link = browser.current_url
    cards = [e.text for e in browser.find_elements("css selector", ".summary .card")]
    fields = {i: browser.find_element("id", i).get_attribute("value") for i in ("model", "engine", "gpu", "kv_dtype",
                                                                               "max_model_len", "concurrency")}
    browser.get("about:blank")
    browser.get(link)
    settle(browser, "#kv-chart svg")
    assert [e.text for e in browser.find_elements("css selector", ".summary .card")] == cards
    assert {i: browser.find_element("id", i).get_attribute("value") for i in fields} == fields
    assert fields["engine"] == "llamacpp" and fields["kv_dtype"] == "q8_0"


def test_a_bad_config_shows_its_error_next_to_the_model(server, browser, tmp_path):
    bad = json.loads((LOGS / "gpt-oss-swa.config.json").read_text())
    del bad["num_hidden_layers"]
    path = tmp_path / "broken-config.json"
    path.write_text(json.dumps(bad))
    browser.get(server + "/")
    settle(browser, "[data-value='kv_memory_bytes']")
    browser.find_element("id", "model-file").send_keys(str(path))
    settle(browser, "#model-error:not([hidden])")
    message = browser.find_element("id", "model-error").text
    request = urllib.request.Request(f"{server}/api/upload?kind=model&name=broken-config.json",
                                     data=path.read_bytes(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request)
    assert message == json.loads(answer.value.read())["error"] and "num_hidden_layers" in message
    assert browser.find_element("id", "top-error").get_attribute("hidden") is not None
    shot(browser, "error-bad-config")
    # a bad value typed into a field is shown next to that field
    set_field(browser, "tp", "0")
    settle(browser, "#tp-error:not([hidden])")
    assert "--tp" in browser.find_element("id", "tp-error").text
    assert browser.find_element("id", "tp").get_attribute("aria-invalid") == "true"


def test_a_good_config_upload_is_planned(server, browser):
    browser.get(server + "/?view=plan&gpu=H100-80GB&engine=vllm")
    settle(browser)
    browser.find_element("id", "model-file").send_keys(str(LOGS / "gpt-oss-swa.config.json"))
    settle(browser, "#kv-chart svg")
    model = browser.find_element("id", "model").get_attribute("value")
    assert model.startswith("upload:model-")
    plan = api(server, "plan", urllib.parse.urlencode({"model": model, "gpu": "H100-80GB", "engine": "vllm"}))
    assert value(browser, "max_concurrency") == f"{plan['capacity']['max_concurrency']:.2f}x"


def test_compare_models_and_engines(server, browser):
    browser.get(server + "/?view=compare&model=llama-3.1-8b&compare=mistral-7b,gemma-2-9b&engine=vllm"
                         "&gpu=H100-80GB&max_model_len=32k")
    settle(browser, "#view-compare table")
    rows = api(server, "compare", "model=llama-3.1-8b&model=mistral-7b&model=gemma-2-9b&engine=vllm"
                                  "&gpu=H100-80GB&context=32k")
    first = browser.find_elements("css selector", "#view-compare table")[0]
    shown = [[td.text for td in tr.find_elements("css selector", "td")]
             for tr in first.find_elements("css selector", "tbody tr")]
    assert [r[0] for r in shown] == [r["model"] for r in rows]
    assert [r[4] for r in shown] == [format_bytes(r["kv_bytes_at_context"]) for r in rows]
    assert [r[6] for r in shown] == [f"{r['max_concurrency']:.2f}x" for r in rows]
    engines = browser.find_elements("css selector", "#view-compare table")[1]
    assert len(engines.find_elements("css selector", "tbody tr")) == 5
    shot(browser, "compare")


def test_a_simulation_over_a_bundled_trace(server, browser):
    browser.get(server + "/?view=simulate&model=llama-3.1-8b&engine=vllm&gpu=L4&max_model_len=16k"
                         "&trace=azure-conv-2023&slice=0:1500&rate_scale=1&guard=1")
    settle(browser, "#view-simulate svg path[data-series='usage']", timeout=120)
    sim = api(server, "simulate", "model=llama-3.1-8b&engine=vllm&gpu=L4&max_model_len=16k&trace=azure-conv-2023"
                                  "&slice=0:1500&rate_scale=1&guard=1")
    assert value(browser, "completed") == f"{sim['completed']:,} of {sim['requests']:,}"
    assert value(browser, "peak_usage") == f"{sim['peak_usage'] * 100:.1f}%"
    text = browser.find_element("id", "view-simulate").text
    assert "Guard decisions" in text and "Microsoft Azure Public Dataset" in text
    band = sim["tpot_s"]["band"]  # the L4's times are transferred within its architecture: the band says where
    assert "true mean likely" in text and f"held-out runs on the {band['basis']} basis" in text
    assert browser.find_elements("css selector", "#view-simulate path[data-series='waiting']")
    assert browser.find_elements("css selector", "#view-simulate path[data-series='ttft-p99']")
    shot(browser, "simulate-azure-conv-guard")
    # a changed setting marks the answer stale until the simulation runs again
    set_field(browser, "slice", "0:500")
    settle(browser, ".stale")
    browser.find_element("id", "run-simulation").click()
    settle(browser, "#view-simulate svg path[data-series='usage']", timeout=120)
    assert not browser.find_elements("css selector", ".stale")
    # clients in a closed loop, as the API runs them
    set_field(browser, "max_concurrency", "4")
    settle(browser, ".stale")
    browser.find_element("id", "run-simulation").click()
    settle(browser, "#view-simulate svg path[data-series='usage']", timeout=120)
    looped = api(server, "simulate", "model=llama-3.1-8b&engine=vllm&gpu=L4&max_model_len=16k&trace=azure-conv-2023"
                                     "&slice=0:500&rate_scale=1&guard=1&max_concurrency=4")
    assert looped["clients"] == 4 and looped["peak_running"] <= 4
    assert "from 4 clients in a closed loop" in browser.find_element("id", "view-simulate").text
    assert value(browser, "completed") == f"{looped['completed']:,} of {looped['requests']:,}"
    shot(browser, "simulate-closed-loop")


def test_a_fleet_of_replicas_behind_a_router(server, browser):
    from selenium.webdriver.common.by import By

    browser.get(server + "/?view=simulate&model=llama-3.1-8b&engine=vllm&gpu=L4&max_model_len=16k"
                         "&trace=azure-conv-2023&slice=0:600&rate_scale=2")
    settle(browser, "#view-simulate svg path[data-series='usage']", timeout=120)
    set_field(browser, "replicas", "3")
    choose(browser, "router", "least-requests")
    settle(browser, ".stale")
    browser.find_element("id", "run-simulation").click()
    settle(browser, "#view-simulate svg path[data-series='usage-2']", timeout=120)
    fleet = api(server, "simulate", "model=llama-3.1-8b&engine=vllm&gpu=L4&max_model_len=16k&trace=azure-conv-2023"
                                    "&slice=0:600&rate_scale=2&replicas=3&router=least-requests")
    assert fleet["fleet"]["router"] == "least-requests" and len(fleet["fleet"]["replicas"]) == 3
    assert value(browser, "completed") == f"{fleet['completed']:,} of {fleet['requests']:,}"
    assert value(browser, "replicas") == "3"
    rows = browser.find_elements(By.CSS_SELECTOR, "[data-value='replicas-table'] tbody tr")
    shown = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    assert [(r[0], r[1]) for r in shown] == [(str(r["index"]), f"{r['routed']:,}") for r in fleet["fleet"]["replicas"]]
    assert [r[6] for r in shown] == [f"{round(r['peak_usage'] * 100)}% / {round(r['mean_usage'] * 100)}%"
                                     for r in fleet["fleet"]["replicas"]]
    assert "null" not in browser.find_element("id", "view-simulate").text
    assert "behind the least-requests router" in browser.find_element("id", "view-simulate").text
    assert browser.find_elements(By.CSS_SELECTOR, "#view-simulate path[data-series='waiting-0']")
    shot(browser, "simulate-fleet")
    # the guard stands in front of one engine: refused on its own control, in one line
    browser.find_element("id", "guard").click()
    browser.find_element("id", "run-simulation").click()
    settle(browser, "#guard-error:not([hidden])")
    assert "in front of a fleet it is not simulated yet" in browser.find_element("id", "guard-error").text
    browser.find_element("id", "guard").click()


def test_an_expert_parallel_group(server, browser):
    """The replicas as the ranks of one expert-parallel group (an MoE model): its own control, the title that says
    so, the ranks as the answer's replicas; the router is refused beside it on its own control."""
    from selenium.webdriver.common.by import By

    browser.get(server + "/?view=simulate&model=qwen3-30b-a3b&engine=vllm&gpu=H100-80GB&max_model_len=8192"
                         "&trace=azure-conv-2023&slice=0:300&rate_scale=4&replicas=2")
    settle(browser, "#view-simulate svg path[data-series='usage-1']", timeout=120)
    browser.find_element("id", "expert_parallel").click()
    settle(browser, ".stale")
    browser.find_element("id", "run-simulation").click()
    settle(browser, "#view-simulate h2", timeout=120)
    settle(browser, "#view-simulate svg path[data-series='usage-1']", timeout=120)
    group = api(server, "simulate", "model=qwen3-30b-a3b&engine=vllm&gpu=H100-80GB&max_model_len=8192"
                                    "&trace=azure-conv-2023&slice=0:300&rate_scale=4&replicas=2&expert_parallel=1")
    assert group["fleet"]["pools"][0]["setup"]["expert_group"]["ranks"] == 2
    text = browser.find_element("id", "view-simulate").text
    assert "an expert-parallel group of 2 data-parallel ranks" in text and "null" not in text
    assert value(browser, "completed") == f"{group['completed']:,} of {group['requests']:,}"
    rows = browser.find_elements(By.CSS_SELECTOR, "[data-value='replicas-table'] tbody tr")
    assert len(rows) == 2
    assert "expert_parallel=1" in browser.current_url
    shot(browser, "simulate-expert-parallel")
    choose(browser, "router", "least-requests")
    browser.find_element("id", "run-simulation").click()
    settle(browser, "#router-error:not([hidden])")
    assert "not with --expert-parallel" in browser.find_element("id", "router-error").text or \
        "expert_parallel" in browser.find_element("id", "router-error").text


def test_a_quality_report(server, browser, tmp_path):
    report = {"model": "smollm2-135m-instruct", "context": 256, "data": ["GPL-3"], "matmul": "fp32",
              "results": [{"variant": v, "tokens": 1024, "windows": 4, "kl_mean": kl, "top1_agreement": top,
                           "perplexity_change": ppl} for v, kl, top, ppl in
                          (("f16", 0.0, 1.0, 0.0), ("q8_0", 0.0052, 0.957, -0.006), ("q4_0", 0.072, 0.856, 0.051))],
              "verdict": "Top token changed on 4 windows of 256 tokens.", "notes": []}
    path = tmp_path / "quality.json"
    path.write_text(json.dumps(report))
    browser.get(server + "/?view=quality")
    settle(browser)
    browser.find_element("id", "report-file").send_keys(str(path))
    settle(browser, "#view-quality table")
    rows = [[td.text for td in tr.find_elements("css selector", "td")]
            for tr in browser.find_elements("css selector", "#view-quality tbody tr")]
    assert [r[0] for r in rows] == ["f16", "q8_0", "q4_0"] and rows[2][2] == "85.6%"
    assert "report=upload" in browser.current_url
    shot(browser, "quality")


def test_keyboard_labels_and_a_phone_width(server, browser):
    browser.get(server + "/?view=plan&model=qwen3-8b&gpu=RTX-4090&max_model_len=32k&concurrency=2")
    settle(browser, "#kv-chart svg")
    unlabelled = browser.execute_script("""
        return [...document.querySelectorAll('#controls input, #controls select')]
          .filter((e) => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map((e) => e.id);""")
    assert unlabelled == []
    tab = browser.find_element("id", "tab-plan")
    tab.send_keys("\ue014")  # ArrowRight: the next view
    settle(browser)
    assert browser.find_element("id", "tab-compare").get_attribute("aria-selected") == "true"
    assert "view=compare" in browser.current_url
    assert browser.switch_to.active_element.get_attribute("id") == "tab-compare"
    browser.set_window_size(390, 900)
    browser.get(server + "/?view=plan&model=qwen3-8b&gpu=RTX-4090&max_model_len=32k&concurrency=2")
    settle(browser, "#kv-chart svg")
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    shot(browser, "plan-phone-width")
    browser.set_window_size(1280, 1000)
