"""``mainspring serve --frontends 2`` with ``otlp_endpoint``, and ``mainspring worker --emulate``: real
processes on loopback. Calls reach either frontend process (the kernel spreads connections); every traced
call's span tree reaches the collector whole, the controller's spans under the frontend's that took it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serving.processes import ServerProcess, http_call
from tests.serving.test_cells_serve import TwoCells
from tests.serving.test_supervision import metric
from tests.telemetry.otlp_receiver import OtlpReceiver

MAX_CALLS = 400  # a connection each: the kernel gives the other process one of them long before
CLIENT_SPAN = "00f067aa0ba902b7"


def test_traces_of_calls_to_every_frontend_process_reach_the_collector_whole(tmp_path: Path) -> None:
    receiver = OtlpReceiver()
    (tmp_path / "repo").mkdir()
    env = {"MAINSPRING_OTLP_ENDPOINT": receiver.url, "MAINSPRING_TRACE_SAMPLE_RATIO": "0"}
    server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", "--workers", "tcp", "--allow-open-workers",
                           "--frontends", "2", "--slo-ms", "5000", env=env)  # fmt: skip
    command = [sys.executable, "-m", "mainspring.cli", "worker", "--controller", server.worker_address,
               "--emulate", "--count", "1", "--models", "1", "--name", "emulated"]  # fmt: skip
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    trace_ids: list[str] = []
    try:
        server.wait_ready()
        _, index = http_call(f"http://{server.http}/v2/repository/index", b"{}")
        (model,) = [entry["name"] for entry in json.loads(index)]
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]}

        def call(trace_id: str) -> int:  # a connection of its own each (urllib keeps none)
            headers = {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01", "Connection": "close"}
            return http_call(f"http://{server.http}/v2/models/{model}/infer", json.dumps(body).encode(), headers)[0]

        # Until the other process has taken calls too (it listens a moment after the server is ready).
        while len(trace_ids) < MAX_CALLS and not (len(trace_ids) >= 8 and metric(server, "mainspring_frontend_calls")):
            trace_ids.append(f"{len(trace_ids) + 1:032x}")
            assert call(trace_ids[-1]) == 200
    finally:
        worker.terminate()
        worker.wait(30)
        assert server.stop() == 0, server.log.read_text()  # each process sends what it still held as it stops
        receiver.close()
    frontends = set()
    for trace_id in trace_ids:
        spans = receiver.of_trace(trace_id)
        (request,) = [s for s in spans if s.parent_span_id == CLIENT_SPAN]
        children = [s for s in spans if s is not request]
        assert {s.parent_span_id for s in children} == {request.span_id}
        assert sorted({s.name for s in children}) == ["admission", "infer on device 0"]
        assert {s.resource["service.instance.id"] for s in children} == {"serve"}
        frontends.add(request.resource["service.instance.id"])
    assert frontends == {"serve", "frontend-1"}  # this process's own frontend, and the other


def test_with_cells_the_cell_that_planned_a_call_exports_its_spans_under_the_frontends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve --cells 2``: the serving process routes each call to a cell's controller, a process of its own,
    which exports the admission and action spans as children of the serving process's span."""
    receiver = OtlpReceiver()
    monkeypatch.setenv("MAINSPRING_OTLP_ENDPOINT", receiver.url)  # the server's environment, and so its cells'
    monkeypatch.setenv("MAINSPRING_TRACE_SAMPLE_RATIO", "0")
    cells = TwoCells(tmp_path, "--slo-ms", "5000")
    trace_ids = [f"{i + 1:032x}" for i in range(len(cells.models) * 2)]
    try:
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]}
        for i, trace_id in enumerate(trace_ids):
            url = f"http://{cells.server.http}/v2/models/{cells.models[i % len(cells.models)]}/infer"
            headers = {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}
            assert http_call(url, json.dumps(body).encode(), headers)[0] == 200
    finally:
        cells.close()
        receiver.close()
    for trace_id in trace_ids:
        spans = receiver.of_trace(trace_id)
        (request,) = [s for s in spans if s.parent_span_id == CLIENT_SPAN]
        assert request.resource["service.instance.id"] == "serve"
        children = [s for s in spans if s is not request]
        assert {s.parent_span_id for s in children} == {request.span_id}
        assert [s.name for s in children].count("admission") == 1 and len(children) >= 2
        (cell,) = {s.resource["service.instance.id"] for s in children}
        assert cell in ("cell-0", "cell-1")
