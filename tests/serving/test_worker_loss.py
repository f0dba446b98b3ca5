"""A worker process killed while loads and inferences are in flight: every request still gets exactly one
answer, and the models are served by the remaining worker afterwards."""

from __future__ import annotations

import collections
import json
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from mainspring.models.repository import ModelRepository
from tests.serving.processes import ServerProcess, http_call, start_worker

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


def wait_for(condition: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_killing_a_worker_mid_flight_loses_no_request(small_zoo: ModelRepository, tmp_path: Path) -> None:
    shutil.copytree(small_zoo.root, tmp_path / "repo")
    server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", "--workers", "tcp", "--slo-ms", "5000")
    workers = []
    try:
        server.wait_ready(path="/v2/health/live")
        # Four pages each: resnet18 (3) and bert_tiny (2) evict each other, so loads are always in flight.
        workers = [start_worker(server.worker_address, tmp_path / "repo", f"w{i}", tmp_path / f"w{i}.log", 64)
                   for i in range(2)]  # fmt: skip
        wait_for(lambda: workers_connected(server) == 2)
        answers: list[tuple[str, int]] = []
        failures: list[BaseException] = []
        stop = threading.Event()

        def client(model: str) -> None:
            while not stop.is_set():
                try:
                    status, _ = http_call(f"http://{server.http}/v2/models/{model}/infer", body(model))
                    answers.append((model, status))
                except BaseException as error:  # a dropped connection would be a lost request
                    failures.append(error)

        threads = [threading.Thread(target=client, args=(m,)) for m in ("resnet18", "bert_tiny", "mlp") * 2]
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        workers[0].send_signal(signal.SIGKILL)
        killed_at = len(answers)
        time.sleep(2.5)  # the controller notices at the latest after 1 s of silence
        stop.set()
        for thread in threads:
            thread.join(60)
        assert not failures, failures
        counts = sorted(collections.Counter(s for _, s in answers).items())
        print(f"answers: {len(answers)}, {killed_at} before the kill; statuses {counts}")
        assert killed_at > 0 and len(answers) > killed_at
        statuses = {status for _, status in answers}
        assert statuses <= {200, 500, 503, 504}, statuses  # a result or an error with a reason; never -1 (server down)
        assert workers_connected(server) == 1
        loads = completed_loads(server)
        print(f"loads completed: {loads}")
        assert loads > 2 * len(BODIES), "the models did not evict each other: no loads in flight"
        for model in BODIES:  # everything is served by the remaining worker
            status, reply = http_call(f"http://{server.http}/v2/models/{model}/infer", body(model))
            assert status == 200, reply
        log = (tmp_path / "server.log").read_text()
        assert "worker w0 lost" in log and "Traceback" not in log and "answered twice" not in log
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
        assert server.stop() == 0
