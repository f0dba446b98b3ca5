"""A worker process killed while loads and inferences are in flight: every request still gets exactly one
answer, and the models are served by the remaining worker afterwards."""

from __future__ import annotations

import collections
import json
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mainspring.models.repository import ModelRepository
from tests.serving.processes import ServerProcess, http_call, start_worker
from tests.waiting import wait_for

BODIES = {
    "mlp": {"name": "input", "datatype": "FP32", "shape": [1, 256]},
    "resnet18": {"name": "input", "datatype": "FP32", "shape": [1, 3, 48, 48]},
    "bert_tiny": {"name": "input_ids", "datatype": "INT64", "shape": [1, 32]},
}


def body(model: str) -> bytes:
    spec = BODIES[model]
    data = np.ones(spec["shape"]).ravel().astype(np.int64 if spec["datatype"] == "INT64" else np.float32).tolist()
    return json.dumps({"inputs": [{**spec, "data": data}]}).encode()


def workers_connected(server: ServerProcess) -> float:
    _, text = http_call(f"http://{server.http}/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    return families["mainspring_workers"].samples[0].value


def completed_loads(server: ServerProcess) -> float:
    _, text = http_call(f"http://{server.http}/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    return sum(s.value for s in families["mainspring_loads"].samples if s.name.endswith("_total"))


def under_load(server: ServerProcess, fault: Callable[[], None], handled: Callable[[], bool]) -> None:
    """Six clients (two per model) send requests back to back; ``fault`` runs once every model has been
    served; the clients stop once ``handled()`` and every model has been served again since. Asserts no
    request was lost (a dropped connection)."""
    answers: list[tuple[str, int]] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def client(model: str) -> None:
        while not stop.is_set():
            try:
                answers.append((model, http_call(f"http://{server.http}/v2/models/{model}/infer", body(model))[0]))
            except BaseException as error:  # a dropped connection would be a lost request
                failures.append(error)

    def served_since(count: int) -> set[str]:
        return {model for model, status in answers[count:] if status == 200}

    threads = [threading.Thread(target=client, args=(m,)) for m in ("resnet18", "bert_tiny", "mlp") * 2]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: served_since(0) == set(BODIES) or failures)  # loads and inferences in flight
        before = len(answers)
        fault()
        wait_for(lambda: handled() or failures)
        noticed = len(answers)
        wait_for(lambda: served_since(noticed) == set(BODIES) or failures)  # served on without the fault
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not failures, failures
    statuses = collections.Counter(status for _, status in answers)
    print(f"answers: {len(answers)}, {before} before the fault; statuses {sorted(statuses.items())}")
    assert set(statuses) <= {200, 500, 503, 504}, statuses  # a result or an error with a reason; never -1 (server down)


def two_workers(tmp_path: Path, small_zoo: ModelRepository) -> tuple[ServerProcess, list[subprocess.Popen[bytes]]]:
    shutil.copytree(small_zoo.root, tmp_path / "repo")
    server = ServerProcess(
        tmp_path / "repo", tmp_path / "server.log", "--workers", "tcp", "--allow-open-workers", "--slo-ms", "5000"
    )
    server.wait_ready(path="/v2/health/live")
    # Four pages each: resnet18 (3) and bert_tiny (2) evict each other, so loads are always in flight.
    workers = [start_worker(server.worker_address, tmp_path / "repo", f"w{i}", tmp_path / f"w{i}.log", 64)
               for i in range(2)]  # fmt: skip
    wait_for(lambda: workers_connected(server) == 2)
    return server, workers


def everything_served_and_answered_once(server: ServerProcess, log: Path) -> None:
    for model in BODIES:
        status, reply = http_call(f"http://{server.http}/v2/models/{model}/infer", body(model))
        assert status == 200, reply
    text = log.read_text()
    assert "worker w0 lost" in text and "Traceback" not in text and "answered twice" not in text


@pytest.mark.slow
def test_killing_a_worker_mid_flight_loses_no_request(small_zoo: ModelRepository, tmp_path: Path) -> None:
    server, workers = two_workers(tmp_path, small_zoo)
    try:
        # The controller notices at the latest after 1 s of silence.
        under_load(server, lambda: workers[0].send_signal(signal.SIGKILL), lambda: workers_connected(server) == 1)
        assert workers_connected(server) == 1
        loads = completed_loads(server)
        print(f"loads completed: {loads}")
        # The remaining worker loaded what the lost one held (more loads than models). How much the
        # models evict each other beyond that depends on placement: 6 to 159 loads were seen in runs
        # of this test, so a kill during a load happens in most runs, not in every one.
        assert loads > len(BODIES), "the remaining worker never loaded the lost worker's models"
        everything_served_and_answered_once(server, tmp_path / "server.log")  # by the remaining worker
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
        assert server.stop() == 0


@pytest.mark.slow
def test_a_worker_frozen_past_the_heartbeat_timeout_rejoins(small_zoo: ModelRepository, tmp_path: Path) -> None:
    """SIGSTOP until the controller declares it lost (1 s of silence): its requests are requeued or answered
    meanwhile; after SIGCONT the results it still sends for them are dropped (never a second answer) and it
    joins again."""
    server, workers = two_workers(tmp_path, small_zoo)
    log = tmp_path / "server.log"
    try:

        def freeze() -> None:
            workers[0].send_signal(signal.SIGSTOP)
            try:
                wait_for(lambda: "worker w0 lost" in log.read_text())
            finally:
                workers[0].send_signal(signal.SIGCONT)

        under_load(server, freeze, lambda: True)  # the freeze lasts until the loss is handled
        began = time.monotonic()
        wait_for(lambda: workers_connected(server) == 2, 60)  # it notices the silence and rejoins
        print(f"rejoined {time.monotonic() - began:.1f} s after the load stopped")
        assert workers[0].poll() is None
        everything_served_and_answered_once(server, tmp_path / "server.log")
        assert "rejoining" in (tmp_path / "w0.log").read_text()  # the same process, its weights kept
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
        assert server.stop() == 0
