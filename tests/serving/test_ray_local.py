"""``serve --ray`` where no Ray cluster runs: with no address, a local instance of its own (as
``ray.init()`` starts one) that stops with the server; with an address nothing answers on, a refusal
that says what to run, at once and without a traceback."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from mainspring.models.repository import ModelRepository
from tests.serving.processes import ServerProcess, alive, command_line, descendants, free_port, http_call

pytestmark = pytest.mark.slow


def no_cluster_env() -> dict[str, str]:
    """The environment of a machine where no Ray cluster is known (none started, none named)."""
    pytest.importorskip("ray")
    if Path("/tmp/ray/ray_current_cluster").exists():
        pytest.skip("a Ray cluster runs on this machine")
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_USAGE_STATS_ENABLED": "0"}


def raylets(server: ServerProcess) -> list[int]:
    """Ray's node managers that ``server`` started (its descendants: not another Ray on this machine)."""
    return [pid for pid in descendants(server.process.pid) if b"raylet" in b"".join(command_line(pid)[:1])]


def test_serve_ray_without_a_cluster_starts_a_local_one_and_stops_it(
    small_zoo: ModelRepository, tmp_path: Path
) -> None:
    env = no_cluster_env()
    server = ServerProcess(small_zoo.root, tmp_path / "server.log", "--ray", "--slo-ms", "30000", env=env)
    try:
        server.wait_ready()
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 256], "data": [0.5] * 256}]}
        status, answer = http_call(f"http://{server.http}/v2/models/mlp/infer", json.dumps(body).encode())
        assert status == 200, answer
        started = raylets(server)
        assert started, "no local Ray instance runs"
    finally:
        assert server.stop() == 0, (tmp_path / "server.log").read_text()
    text = (tmp_path / "server.log").read_text()
    assert "starting a local one" in text and "Traceback" not in text, text
    assert not re.search(r"mainspring\S* ERROR", text), text
    deadline = time.monotonic() + 60
    while any(map(alive, started)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(alive, started)), "the local Ray instance outlived the server"


def test_serve_ray_at_an_address_nothing_answers_on_says_what_to_run(
    small_zoo: ModelRepository, tmp_path: Path
) -> None:
    env = no_cluster_env()
    address = f"127.0.0.1:{free_port()}"
    server = ServerProcess(small_zoo.root, tmp_path / "server.log", "--ray", address, env=env)
    try:
        code = server.process.wait(120)
    finally:
        server.stop()
    text = (tmp_path / "server.log").read_text()
    assert code == 1, text
    assert f"cannot reach the Ray cluster at '{address}'" in text and "ray start --head" in text, text
    assert "Traceback" not in text and "cannot join thread" not in text, text
