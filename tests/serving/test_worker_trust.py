"""Workers prove who they are, with real processes on loopback: a default ``mainspring serve`` takes its
local workers over a socket in a folder only its user may enter, so a rogue process speaking the protocol
on the worker port gets no tensor, adds no model and answers no client; ``--workers tcp`` needs a secret,
or the channel opened on purpose (``--allow-open-workers``, warned about)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import zmq

from mainspring.models.repository import ModelRepository
from mainspring.protocol import DeviceSpec
from mainspring.protocol.models import ModelInfo
from mainspring.transport.messages import Hello, encode
from tests.controller.test_rogue_worker import EVIL, INFO
from tests.serving.processes import ServerProcess, http_call

MLP_INPUT = {"name": "input", "datatype": "FP32", "shape": [1, 256], "data": [0.5] * 256}


def rogue_hello(context: zmq.Context[zmq.Socket[bytes]], endpoint: str, models: list[ModelInfo]) -> zmq.Socket[bytes]:
    rogue = context.socket(zmq.DEALER)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(endpoint)
    device = DeviceSpec(0, "cpu", 256 * 1024 * 1024, resident=tuple(m.config.name for m in models))
    with contextlib.suppress(zmq.Again):
        rogue.send_multipart(encode(Hello("rogue", [device], models)), flags=zmq.NOBLOCK)
    return rogue


def test_a_rogue_process_gets_nothing_from_a_default_server(small_zoo: ModelRepository, tmp_path: Path) -> None:
    server = ServerProcess(small_zoo.root, tmp_path / "server.log", "--slo-ms", "30000")
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        server.wait_ready()
        log = server.log.read_text()
        channel = re.search(r"workers connect to ipc://(\S+)/workers", log)
        assert channel is not None, log
        assert stat.S_IMODE(os.stat(channel.group(1)).st_mode) == 0o700  # only this user may enter
        rogue = rogue_hello(context, server.worker_address, [INFO, EVIL])  # the worker port, as before
        received = 0
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            body = json.dumps({"inputs": [MLP_INPUT]}).encode()
            status, answer = http_call(f"http://{server.http}/v2/models/mlp/infer", body)
            assert status == 200 and len(json.loads(answer)["outputs"][0]["data"]) == 10
            while rogue.poll(0):
                rogue.recv_multipart()
                received += 1
            with contextlib.suppress(zmq.Again):  # its queue fills: nothing takes its hellos
                rogue.send_multipart(encode(Hello("rogue", [DeviceSpec(0, "cpu")], [EVIL])), flags=zmq.NOBLOCK)
        assert received == 0
        _, index = http_call(f"http://{server.http}/v2/repository/index", b"{}")
        assert "evil" not in {m["name"] for m in json.loads(index)}
        _, metrics = http_call(f"http://{server.http}/metrics")
        assert b"mainspring_workers 1.0" in metrics
    finally:
        context.destroy(linger=0)
        assert server.stop() == 0, server.log.read_text()
    assert not Path(channel.group(1)).exists()  # removed at the stop


def test_tcp_workers_need_a_secret_or_the_channel_opened_on_purpose(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAINSPRING_")}
    command = [sys.executable, "-m", "mainspring.cli", "serve", "--workers", "tcp", "--repo", str(tmp_path)]
    refused = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and refused.stdout == "", refused
    (line,) = refused.stderr.strip().splitlines()
    assert "worker_secret" in line and "allow_open_workers" in line, line

    server = ServerProcess(tmp_path, tmp_path / "server.log", "--workers", "tcp", "--allow-open-workers")
    try:
        server.wait_ready(path="/v2/health/live")
        log = server.log.read_text()
        assert re.search(r"WARNING allow_open_workers: any process that reaches tcp://127\.0\.0\.1:\d+ can join", log)
    finally:
        assert server.stop() == 0, server.log.read_text()
