"""The Recommend view in a real headless Chromium: fill the search's form, get the answer the API gives, download the
chosen deployment's files, and see an objective none meets named with the closest candidate. Run with
`pytest -m browser tests/browser/test_recommend_page.py`."""

from __future__ import annotations

import io
import json
import time
import urllib.error
import urllib.request
import zipfile

import pytest

from tests.browser.test_page import api, browser, server, set_field, settle, shot  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

SEARCH = {"rate": "2", "requests": "20", "rec_slo": "ttft_p99=2s,tpot_p99=50ms", "rec_gpus": "H100-80GB,L40S",
          "rec_gpu_price": "H100-80GB=2.49,L40S=0.86", "rec_max_gpus": "1", "rec_tp": "1", "rec_kv_dtype": "auto,fp8"}
QUERY = ("model=llama-3.1-8b&engine=vllm&rate=2&requests=20&slo=ttft_p99%3D2s%2Ctpot_p99%3D50ms"
         "&gpus=H100-80GB%2CL40S&gpu_price=H100-80GB%3D2.49%2CL40S%3D0.86&max_gpus=1&tp=1&kv_dtype=auto%2Cfp8")


def _error(base: str, query: str) -> dict:
    try:
        return api(base, "recommend", query)
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def test_fill_the_search_get_the_answer_and_download_the_files(server, browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    browser.get(server + "/?view=recommend&model=llama-3.1-8b&engine=vllm")
    settle(browser, "#rec_slo-error:not([hidden])")  # a link without objectives: the field says what to give
    said = _error(server, "model=llama-3.1-8b&engine=vllm")
    assert browser.find_element(By.ID, "rec_slo-error").text == said["error"]
    for field, text in SEARCH.items():
        set_field(browser, field, text)
    browser.find_element(By.ID, "run-recommend").click()
    settle(browser, "#chosen", timeout=120)
    answer = api(server, "recommend", QUERY)
    view = browser.find_element(By.ID, "view-recommend").text
    assert browser.find_element(By.CSS_SELECTOR, "[data-value='best']").text == answer["best"]["label"]
    assert f"${answer['best']['price_per_hour']:,.2f}/hour" in view
    for loser in answer["runners_up"]:
        assert loser["why"] in view
    for check in answer["quality_checks"]:  # fp8 among the answers: its quality to check
        assert check in view
    assert "the page's" not in view and "null" not in view
    shot(browser, "recommend")

    # the files: one zip, the API's texts
    browser.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)})
    browser.find_element(By.ID, "download-files").click()
    path = tmp_path / "deployment.zip"
    for _ in range(200):
        if path.exists() and path.stat().st_size:
            break
        time.sleep(0.05)
    with zipfile.ZipFile(path) as archive:
        got = {name: archive.read(name).decode() for name in archive.namelist()}
    assert got == {f["name"]: f["text"] for f in answer["files"]}
    with urllib.request.urlopen(f"{server}/api/recommend.zip?{QUERY}") as r, zipfile.ZipFile(io.BytesIO(r.read())) as z:
        assert sorted(z.namelist()) == sorted(got)

    # objectives none meets: what binds and the closest candidate, in the page, not an error page
    set_field(browser, "rec_slo", "ttft_p99=1ms")
    browser.find_element(By.ID, "run-recommend").click()
    settle(browser, "#binding", timeout=120)
    binding = api(server, "recommend", QUERY.replace("ttft_p99%3D2s%2Ctpot_p99%3D50ms", "ttft_p99%3D1ms"))["binding"]
    assert browser.find_element(By.ID, "binding").text == f"No candidate meets the objectives: {binding}"
    assert not browser.find_elements(By.ID, "download-files")
    shot(browser, "recommend-none-meets")
