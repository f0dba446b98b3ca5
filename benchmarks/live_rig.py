"""A live server for benchmarks: ``mainspring serve --workers tcp`` with emulated devices in worker processes
of their own, on free ports, and Poisson load from this process's driver (as ``mainspring bench``).

Used by ``overload_knee.py``, ``controller_cost_live.py`` and ``knee_live_vs_sim.py``. The frontends run in
processes of their own with ``frontends >= 1``; with ``cells >= 1`` the controllers are cell processes
(``serving.local_cells``), each with its own emulated worker.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

from mainspring.bench.driver import Sent, drive
from mainspring.bench.report import build
from mainspring.bench.senders import HttpSender
from mainspring.models.profile import ModelProfile
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import PoissonOpenLoop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.serving.processes import free_ports, http_call

MAINSPRING = [sys.executable, "-m", "mainspring.cli"]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """The process's CPU time so far (user and system, all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def children(pid: int) -> list[int]:
    """The process's children, whichever of its threads started them."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if parent == pid:
            found.append(int(stat.parent.name))
    return found


class LiveServer:
    """A server and its emulated workers (``devices`` in all, ``models`` each). ``settings``: more of
    ``ServeConfig``'s fields. ``cells`` 0: the controller is the serve process itself, which is also the
    frontend; ``cells`` N >= 1: N controller processes (``serving.local_cells``; 1: the controller apart from
    the frontend), each with an emulated worker of its own."""

    def __init__(self, folder: Path, settings: dict[str, object] | None = None, frontends: int = 1, cells: int = 0,
                 devices: int = 8, models: int = 200, slo_ms: float = 100.0, tag: str = "") -> None:  # fmt: skip
        self.http, grpc = free_ports(2)
        self.cells = cells
        self._logs: list[IO[bytes]] = []
        worker_port = _free_run(max(cells, 1))  # cell i takes workers on worker_port + i
        config = {"workers": "tcp", "allow_open_workers": True, "http_port": self.http, "grpc_port": grpc,
                  "worker_port": worker_port, "frontends": frontends, "slo_ms": slo_ms, "cells": max(cells, 1),
                  **(settings or {})}  # fmt: skip
        run = "run_cells" if cells else "run_server"
        code = (f"import json, sys; from mainspring.serving.config import ServeConfig; "
                f"from mainspring.serving.{'local_cells' if cells else 'server'} import {run}; "
                f"raise SystemExit({run}(ServeConfig(**json.loads(sys.argv[1]))))")  # fmt: skip
        self.server = self._start([sys.executable, "-c", code, json.dumps(config)], folder / f"serve{tag}.log")
        ports = max(cells, 1)
        per_worker = [devices // ports + (i < devices % ports) for i in range(ports)]
        self.workers = []
        for i, count in enumerate(per_worker):
            emulate = [*MAINSPRING, "worker", "--controller", f"tcp://127.0.0.1:{worker_port + i}", "--emulate",
                       "--count", str(count), "--models", str(models), "--name", f"emulated-{i}"]  # fmt: skip
            self.workers.append(self._start(emulate, folder / f"worker{tag}-{i}.log"))
        try:
            self._wait_ready(devices, folder)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, devices: int, folder: Path) -> None:
        deadline = time.monotonic() + 120
        while http_call(f"http://127.0.0.1:{self.http}/v2/health/ready")[0] != 200 or not self._all_devices(devices):
            if time.monotonic() > deadline or self.server.poll() is not None:
                raise RuntimeError(f"the server did not get ready: see {folder}")
            time.sleep(0.2)

    def _start(self, command: list[str], log: Path) -> subprocess.Popen[bytes]:
        out = log.open("wb")
        self._logs.append(out)
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def _all_devices(self, devices: int) -> bool:
        text = self.metrics_text()
        return (
            sum(float(v) for v in re.findall(rb"^mainspring_devices(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE))
            == devices
        )

    def metrics_text(self) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=10) as response:
            body: bytes = response.read()
            return body

    def controller_pids(self) -> list[int]:
        """The processes that run a controller: the serve process, or its cell processes."""
        if not self.cells:
            return [self.server.pid]
        return [p for p in children(self.server.pid) if b"local_cells" in Path(f"/proc/{p}/cmdline").read_bytes()]

    def controllers_cpu_s(self) -> float:
        return sum(cpu_s(pid) for pid in self.controller_pids())

    def stop(self) -> None:
        for worker in self.workers:
            worker.terminate()
        self.server.send_signal(signal.SIGINT)
        for process in (*self.workers, self.server):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in self._logs:
            log.close()


def _free_run(count: int) -> int:
    """The first of ``count`` consecutive free ports."""
    for _ in range(50):
        first = free_ports(1)[0]
        if first + count < 65536 and all(_is_free(first + i) for i in range(1, count)):
            return first
    raise RuntimeError(f"no run of {count} free ports")


def _is_free(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def ready_models(port: int) -> list[str]:
    status, body = http_call(f"http://127.0.0.1:{port}/v2/repository/index", json.dumps({"ready": True}).encode())
    assert status == 200, body
    return [entry["name"] for entry in json.loads(body)]


async def offer(port: int, rate: float, seconds: float, seed: int, slo_ms: float = 100.0
                ) -> tuple[dict[str, object], list[Sent]]:  # fmt: skip
    """Poisson arrivals at ``rate`` over every ready model for ``seconds``: ``mainspring bench``'s report, and
    each call as sent."""
    sender = HttpSender(f"127.0.0.1:{port}")
    try:
        models = ready_models(port)
        await sender.prepare(models)
        profiles = [ModelProfile(m, "live", 1, 1, {1: 1}) for m in models]
        workload = PoissonOpenLoop(rate)
        duration = s_to_ns(seconds)
        arrivals = workload.arrivals(profiles, duration, random.Random(seed))
        result = await drive(arrivals, workload, sender, ms_to_ns(slo_ms), duration)
        return build(result), result.sent
    finally:
        await sender.close()
