"""``mainspring worker --emulate``: emulated devices in a process of their own (the simulator's profiles and
noise, real-time lanes, each model echoing its input) join a controller like any worker, so that a controller
is load-tested without GPUs. Real processes on loopback."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mainspring.cli import main
from tests.serving.processes import ServerProcess, http_call
from tests.serving.test_supervision import metric


def test_emulated_devices_join_a_controller_and_every_request_is_answered_once(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    server = ServerProcess(
        tmp_path / "repo", tmp_path / "server.log", "--workers", "tcp", "--allow-open-workers", "--slo-ms", "2000"
    )
    command = [sys.executable, "-m", "mainspring.cli", "worker", "--controller", server.worker_address,
               "--emulate", "--count", "3", "--models", "12", "--name", "emulated"]  # fmt: skip
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        server.wait_ready()
        status, index = http_call(f"http://{server.http}/v2/repository/index", b"{}")
        models = sorted(entry["name"] for entry in json.loads(index))
        assert status == 200 and len(models) == 12 and models[0].startswith("resnet"), models
        assert metric(server, "mainspring_devices") == 3

        def ask(i: int) -> tuple[int, list[float], list[float]]:
            values = [random.Random(i).random() for _ in range(4)]
            body = {"id": str(i), "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": values}]}
            status, raw = http_call(f"http://{server.http}/v2/models/{models[i % 12]}/infer", json.dumps(body).encode())
            answer = json.loads(raw)
            return status, values, answer["outputs"][0]["data"] if status == 200 else answer

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(240)))
        assert all(status == 200 for status, _, _ in answers), [a for a in answers if a[0] != 200][:3]
        for _, sent, echoed in answers:  # each its own answer: the emulated model echoes its input
            assert echoed == pytest.approx(sent, rel=1e-6)
        assert metric(server, "mainspring_requests") >= 240
    finally:
        worker.terminate()
        worker.wait(30)
        assert server.stop() == 0, (tmp_path / "server.log").read_text()


def test_the_worker_command_refuses_flags_that_do_not_go_together(capsys: pytest.CaptureFixture[str]) -> None:
    for flags, said in ((["--repo", "x", "--emulate"], "not both"), ([], "not both"),
                        (["--emulate", "--count", "0"], "argument --count: must be an integer in [1, 4096], got '0'"),
                        (["--repo", "x", "--count", "2"], "go with --emulate")):  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            main(["worker", "--controller", "tcp://127.0.0.1:1", *flags])
        assert stopped.value.code == 2 and said in capsys.readouterr().err, flags
