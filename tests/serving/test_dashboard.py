"""The built-in live page, in a real headless browser (Debian's chromium through Selenium and the
system chromedriver: nothing is downloaded), against a real server under load: every panel checked in the
DOM, and a screenshot of it kept in ``out/screenshots/`` for a person to look at."""

from __future__ import annotations

import base64
import json
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mainspring.models.repository import ModelRepository
from tests.serving.processes import ServerProcess, http_call
from tests.serving.test_cells_serve import TwoCells, infer
from tests.serving.test_worker_loss import body
from tests.waiting import wait_for

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (the Makefile's set-up installs them)",
)
SCREENSHOTS = Path(__file__).resolve().parents[2] / "out" / "screenshots"
VIEW_KEYS = {"now_ns", "since_ns", "answers_from_ns", "devices", "action_columns", "actions", "in_flight",
             "answer_columns", "answers", "explained", "last_used_ns", "models", "pools", "loop_lag_ms"}  # fmt: skip


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
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1200,1500",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The live page in the browser, read through its ``data-*`` attributes."""

    def __init__(self, driver: object, address: str) -> None:
        self.driver = driver
        driver.get(f"http://{address}/dashboard")  # type: ignore[attr-defined]

    def count(self, selector: str) -> int:
        return int(self._read("return document.querySelectorAll(arguments[0]).length", selector))

    def attribute(self, selector: str, name: str) -> str:
        return str(self._read("return document.querySelector(arguments[0])?.getAttribute(arguments[1]) ?? ''",
                              selector, name))  # fmt: skip

    def text(self, selector: str) -> str:
        return str(self._read("return document.querySelector(arguments[0])?.textContent ?? ''", selector))

    def _read(self, script: str, *args: str) -> object:
        """Read in one step of the page's own thread: the page redraws twice a second, so an element found in one
        call may be gone by the next."""
        return self.driver.execute_script(script, *args)  # type: ignore[attr-defined]

    @property
    def updates(self) -> int:
        return int(self.attribute("#summary", "data-updates") or 0)

    def screenshot(self, name: str) -> Path:
        """The whole page, below the window too, as a PNG under ``out/screenshots/`` (kept after the run: its path
        is printed)."""
        bottom = self._read("return Math.ceil(document.body.getBoundingClientRect().bottom) + 16")
        width = self._read("return document.documentElement.scrollWidth")
        clip = {"x": 0, "y": 0, "width": width, "height": bottom, "scale": 1}
        shot = self.driver.execute_cdp_cmd(  # type: ignore[attr-defined]
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
        )
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / name
        path.write_bytes(base64.b64decode(shot["data"]))
        print(f"the live page's screenshot: {path}")
        return path


def test_the_page_is_served_from_the_package_and_its_data_and_bad_parameter(server: ServerProcess) -> None:
    base = f"http://{server.http}/dashboard"
    status, page = http_call(base)
    assert status == 200
    sources = re.findall(rb'(?:src|href)="([^"]+)"', page)
    assert sources and all(s.startswith(b"/dashboard/") for s in sources), sources  # nothing from elsewhere
    for source in sources:
        status, text = http_call(f"http://{server.http}{source.decode()}")
        assert status == 200 and b"https://" not in text
    assert http_call(f"{base}/nothing.js")[0] == 404
    status, reply = http_call(f"{base}/timeline?seconds=lots")
    assert status == 400 and "'seconds'" in json.loads(reply)["error"]
    assert http_call(f"{base}/timeline?seconds=1e9")[0] == 400
    status, reply = http_call(f"{base}/timeline?cursor=drop%20table")
    assert status == 400 and "'cursor'" in json.loads(reply)["error"]
    assert http_call(f"{base}/timeline?cursor=1:2:3")[0] == 400  # its characters, not a cursor's form
    status, reply = http_call(f"{base}/timeline?seconds=5")
    data = json.loads(reply)
    assert status == 200 and set(data) == {"seconds", "cursor", "views"} and len(data["views"]) == 1
    (view,) = data["views"]
    assert set(view) == VIEW_KEYS and view["devices"] == [0]
    assert {m["model"] for m in view["models"]} >= {"mlp", "bert_tiny"}
    assert [p["device"] for p in view["pools"]] == [0] and view["pools"][0]["total_pages"] > 0
    assert http_call(f"http://{server.http}/v2/models/mlp/infer", body("mlp"))[0] == 200
    # After the cursor: only what came since (the answer above, and the actions that served it), not again.
    status, reply = http_call(f"{base}/timeline?seconds=30&cursor={data['cursor']}")
    (since,) = json.loads(reply)["views"]
    model = since["answer_columns"].index("model")
    assert status == 200 and [a[model] for a in since["answers"]] == ["mlp"]
    assert since["since_ns"] == view["now_ns"]  # it follows on from the last view: the page keeps its rows
    status, reply = http_call(f"{base}/timeline?seconds=30&cursor={json.loads(reply)['cursor']}")
    assert json.loads(reply)["views"][0]["answers"] == []


def test_every_panel_under_load_and_a_miss_explained(server: ServerProcess, browser: object) -> None:
    page = Page(browser, server.http)
    wait_for(lambda: page.updates >= 1 and page.count('svg[data-device="0"]') == 1)
    stop = threading.Event()

    def load() -> None:  # steady requests to two models: infers on the exec lane, loads on the load lane
        while not stop.is_set():
            for model in ("mlp", "bert_tiny"):
                http_call(f"http://{server.http}/v2/models/{model}/infer", body(model))

    client = threading.Thread(target=load)
    client.start()
    try:
        # Lanes: each action where it ran under the window it was predicted for, on a time axis.
        wait_for(
            lambda: page.count('rect[data-mark="actual"][data-lane="exec"][data-status="ok"][data-model="bert_tiny"]')
        )
        wait_for(lambda: page.count('rect[data-mark="actual"][data-lane="load"][data-kind="load"]') > 0)
        assert page.count('rect[data-mark="predicted"][data-lane="exec"][data-model="mlp"]') > 0
        assert page.count('svg[data-device="0"] line[data-tick]') == 6  # 0, 2, ..., 10 s before now
        assert "now" in page.text('svg[data-device="0"]') and "-10 s" in page.text('svg[data-device="0"]')
        # Models: rate, attainment, p50 and p99, where each is held, when last used.
        wait_for(lambda: float(page.attribute('tr[data-model="mlp"]', "data-rate") or 0) > 0)
        wait_for(lambda: page.attribute('tr[data-model="bert_tiny"]', "data-resident") == "0")
        row = 'tr[data-model="mlp"]'
        assert float(page.attribute(row, "data-attained")) == 1.0
        assert 0 < float(page.attribute(row, "data-p50")) <= float(page.attribute(row, "data-p99"))
        assert float(page.attribute(row, "data-last-used")) >= 0
        # What each device did: how busy its exec lane was, how far its batches ran from their predictions.
        activity = 'p.activity[data-device="0"]'
        assert int(page.attribute(activity, "data-infers")) > 0
        assert 0 < float(page.attribute(activity, "data-busy")) <= 1
        assert "after its prediction at the median" in page.text(activity)
        # Pool use: the device's pages its models hold.
        used = int(page.attribute('div.pool[data-device="0"]', "data-used"))
        assert 0 < used <= int(page.attribute('div.pool[data-device="0"]', "data-total"))
        assert "bert_tiny" in page.text('div.pool[data-device="0"]')
        # The controller's loop lag.
        assert float(page.attribute("#loop-lag", "data-ms")) >= 0 and "loop lag" in page.text("#loop-lag")
        # A request that cannot make its SLO is rejected at once: a miss on the page, explained, and counted.
        rejected = json.dumps({**json.loads(body("mlp")), "parameters": {"slo_ms": 0.01}}).encode()
        assert http_call(f"http://{server.http}/v2/models/mlp/infer", rejected)[0] == 503
        wait_for(lambda: page.count('rect[data-miss="deadline_at_arrival"][data-model="mlp"]') > 0)
        explained = '#explained li[data-model="mlp"][data-outcome="deadline_at_arrival"]'
        wait_for(lambda: page.count(explained) == 1)
        assert page.attribute(explained, "data-cause") == "rejected at arrival: the deadline could not be met"
        assert "rejected at arrival" in page.text(explained)
        before = page.updates
        wait_for(lambda: page.updates >= before + 3)  # it keeps polling while the load runs
        # Still once each, though every poll since brought the page new rows: none repeated, none lost.
        assert "deadline_at_arrival:1" in page.attribute(row, "data-rejections").split(",")
        assert page.count('rect[data-miss="deadline_at_arrival"]') == 1
        summary = page.text("#counts")
        assert "1 device(s)" in summary and "misses" in summary
        assert page.count("#cells tr[data-cell]") == 0  # one controller: no cells
        assert page.screenshot("dashboard.png").stat().st_size > 10_000
    finally:
        stop.set()
        client.join(60)


def test_with_cells_each_cells_loop_lag_and_devices(tmp_path: Path, browser: object) -> None:
    cells = TwoCells(tmp_path, "--slo-ms", "2000")
    try:
        for i in range(20):
            assert infer(cells.server, cells.models[i % len(cells.models)], i)[0] == 200
        page = Page(browser, cells.server.http)
        wait_for(lambda: page.count("#cells tr[data-cell]") == 2)
        assert all(float(page.attribute(f'#cells tr[data-cell="{i}"]', "data-lag-ms")) >= 0 for i in (0, 1))
        wait_for(lambda: page.count("div.pool[data-device]") == 2)
        # A row a model, each cell's answers together: those that served these hold them (a device of a cell).
        assert page.count("#models tr[data-model]") == len(cells.models)
        wait_for(lambda: all(page.attribute(f'tr[data-model="{m}"]', "data-resident") for m in cells.models))
        assert page.count('svg[data-device="0"]') == 1 and page.count('svg[data-device="1000"]') == 1
        page.screenshot("dashboard-cells.png")
    finally:
        cells.close()
