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
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


class LiveServer:
    """A server and its emulated workers (``devices`` in all, ``models`` each); ``env``: settings as
    ``MAINSPRING_*`` variables. ``cells`` 0: the controller is the serve process itself."""

    def __init__(self, folder: Path, env: dict[str, str] | None = None, frontends: int = 1, cells: int = 0,
                 devices: int = 8, models: int = 200, slo_ms: float = 100.0, tag: str = "") -> None:  # fmt: skip
        self.http, grpc = free_ports(2)
        worker_ports = free_ports(max(cells, 1))
        self.cells = cells
        environment = {**os.environ, **(env or {})}
        self._logs: list[IO[bytes]] = []
        serve = [*MAINSPRING, "serve", "--workers", "tcp", "--allow-open-workers", "--http-port", str(self.http),
                 "--grpc-port", str(grpc), "--worker-port", str(worker_ports[0]), "--frontends", str(frontends),
                 "--slo-ms", str(slo_ms)]  # fmt: skip
        if cells:
            # cells take consecutive worker ports from --worker-port: ask for a free run of them
            base = _free_run(cells)
            worker_ports = list(range(base, base + cells))
            serve[serve.index("--worker-port") + 1] = str(base)
            serve += ["--cells", str(cells)]
        self.server = self._start(serve, folder / f"serve{tag}.log", environment)
        spread = len(worker_ports)
        per_worker = [devices // spread + (i < devices % spread) for i in range(spread)]
        self.workers = []
        for i, (port, count) in enumerate(zip(worker_ports, per_worker, strict=True)):
            emulate = [*MAINSPRING, "worker", "--controller", f"tcp://127.0.0.1:{port}", "--emulate", "--count",
                       str(count), "--models", str(models), "--name", f"emulated-{i}"]  # fmt: skip
            self.workers.append(self._start(emulate, folder / f"worker{tag}-{i}.log", environment))
        deadline = time.monotonic() + 120
        while http_call(f"http://127.0.0.1:{self.http}/v2/health/ready")[0] != 200 or not self._all_devices(devices):
            if time.monotonic() > deadline or self.server.poll() is not None:
                raise RuntimeError(f"the server did not get ready: see {folder}")
            time.sleep(0.2)

    def _start(self, command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        out = log.open("wb")
        self._logs.append(out)
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)

    def _all_devices(self, devices: int) -> bool:
        return f"mainspring_devices {devices}".encode() in self.metrics_text() if not self.cells else True

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
