"""The built-in live page, in a real headless browser (Debian's chromium through Selenium and the
system chromedriver: nothing is downloaded), against a real server under load."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator

import pytest

from mainspring.models.repository import ModelRepository
from tests.serving.processes import ServerProcess, http_call
from tests.serving.test_worker_loss import body
from tests.waiting import wait_for

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (the Makefile's set-up installs them)",
)


@pytest.fixture(scope="module")
def server(small_zoo: ModelRepository, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("dashboard")
    shutil.copytree(small_zoo.root, folder / "repo")
    process = ServerProcess(folder / "repo", folder / "server.log", "--slo-ms", "30000")
    try:
        process.wait_ready()
        yield process
    finally:
        assert process.stop() == 0, (folder / "server.log").read_text()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def test_the_timeline_data_and_its_bad_parameter(server: ServerProcess) -> None:
    url = f"http://{server.http}/dashboard/timeline"
    status, reply = http_call(f"{url}?seconds=lots")
    assert status == 400 and "'seconds'" in json.loads(reply)["error"]
    assert http_call(f"{url}?seconds=1e9")[0] == 400
    status, reply = http_call(f"{url}?seconds=5")
    data = json.loads(reply)
    assert status == 200 and data["devices"] == [0] and set(data) == {"seconds", "devices", "actions", "misses"}


def test_the_page_draws_each_lane_and_updates_under_load(server: ServerProcess, browser: object) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(f"http://{server.http}/dashboard")  # type: ignore[attr-defined]

    def updates() -> int:
        return int(driver.find_element(By.ID, "summary").get_attribute("data-updates") or 0)  # type: ignore[attr-defined]

    def marks(selector: str) -> int:
        return len(driver.find_elements(By.CSS_SELECTOR, selector))  # type: ignore[attr-defined]

    wait_for(lambda: updates() >= 1 and marks('svg[data-device="0"]') == 1)
    stop = threading.Event()

    def load() -> None:  # steady requests to two models: infers on the exec lane, loads on the load lane
        while not stop.is_set():
            for model in ("mlp", "bert_tiny"):
                http_call(f"http://{server.http}/v2/models/{model}/infer", body(model))

    client = threading.Thread(target=load)
    client.start()
    try:
        wait_for(lambda: marks('rect[data-lane="exec"][data-status="ok"][data-model="bert_tiny"]') > 0)
        wait_for(lambda: marks('rect[data-lane="load"][data-kind="load"]') > 0)
        before = updates()
        wait_for(lambda: updates() >= before + 3)  # it keeps polling while the load runs
        assert marks('rect[data-lane="exec"][data-model="mlp"]') > 0
        # A request that cannot make its SLO is rejected at once: a miss on the page.
        rejected = json.dumps({**json.loads(body("mlp")), "parameters": {"slo_ms": 0.01}}).encode()
        assert http_call(f"http://{server.http}/v2/models/mlp/infer", rejected)[0] == 503
        wait_for(lambda: marks('rect[data-miss="deadline_at_arrival"][data-model="mlp"]') > 0)
        summary = driver.find_element(By.ID, "counts").text  # type: ignore[attr-defined]
        assert "1 device(s)" in summary and "misses" in summary
    finally:
        stop.set()
        client.join(60)
