"""What OpenTelemetry tracing (``otlp_endpoint``) costs per call, off and on, side by side in one run.

Three in-process servers (``ControllerService`` and its ``DataPlane``, an emulated device whose model takes
1 microsecond), each driven through ``DataPlane.infer`` by closed-loop tasks for ``--seconds``, alternating
for ``--rounds``: tracing off (the default: no tracer; the calls pay one attribute check), on with every call
unsampled (``trace_sample_ratio`` 0, no client traceparent: a non-recording span each), and on with every call
traced (a span per call and its controller's admission and action spans, exported over OTLP/HTTP to a
collector in another process that reads and discards them). Prints this process's CPU per call in each mode
(the exporter's thread included) and the ratios to off; and, for scale, what the attribute check alone costs.

    .venv/bin/python benchmarks/tracing_cost.py [--seconds 5] [--rounds 2] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import subprocess
import sys
import time
import timeit

import numpy as np

from mainspring.controller.service import ControllerService
from mainspring.frontend.dataplane import DataPlane, Tensor
from mainspring.models.profile import ModelProfile
from mainspring.protocol import DeviceSpec
from mainspring.telemetry.tracing import Tracing
from mainspring.worker.emulated_worker import EmulatedWorker
from mainspring.worker.inprocess import InProcessWorker
from mainspring.worker.runtimes.emulated import NoiseModel

MODES = ("off", "on, unsampled", "on, every call traced")
# A collector that reads each export and answers 200 with an empty body (an empty ExportTraceServiceResponse).
COLLECTOR = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread: the exporter's too
    return usage.ru_utime + usage.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(tracing: Tracing | None) -> tuple[ControllerService, DataPlane]:
    service = ControllerService(default_slo_ms=1000, tracing=tracing)
    profiles = {"echo": ModelProfile("echo", "instant", 4096, 1_000, {1: 1_000, 2: 1_000, 4: 1_000, 8: 1_000})}
    specs = [DeviceSpec(0, "instant")]
    InProcessWorker("emulated", lambda sink: EmulatedWorker(specs, profiles, sink, NoiseModel.exact()),
                    service.worker_events, asyncio.get_running_loop()).join()  # fmt: skip
    return service, DataPlane(service, tracing=tracing)


async def drive(plane: DataPlane, seconds: float, concurrency: int) -> tuple[int, float]:
    """Calls answered and this process's CPU seconds in ``seconds`` of ``concurrency`` closed-loop clients."""
    row = [Tensor("input", "FP32", [1, 4], np.ones((1, 4), np.float32))]
    done, stop = 0, time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        while time.monotonic() < stop:
            await plane.infer("echo", None, row, None, {}, time.monotonic_ns())
            done += 1

    begin = cpu_s()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return done, cpu_s() - begin


async def main(seconds: float, rounds: int, concurrency: int, endpoint: str) -> None:
    tracings = [None, Tracing(endpoint, 0.0, "unsampled"), Tracing(endpoint, 1.0, "traced")]
    planes = [start(tracing)[1] for tracing in tracings]
    await asyncio.sleep(0.5)  # the workers joined
    for plane in planes:
        await drive(plane, 0.5, concurrency)  # loaded, warm
    calls, cpu = [0] * 3, [0.0] * 3
    for _ in range(rounds):
        for index, plane in enumerate(planes):
            done, spent = await drive(plane, seconds, concurrency)
            calls[index] += done
            cpu[index] += spent
    for tracing in tracings:
        if tracing is not None:
            tracing.close()
    off_us = cpu[0] / calls[0] * 1e6
    print(f"{'mode':<24} {'calls':>8} {'CPU us/call':>12} {'vs off':>7}")
    for mode, n, spent in zip(MODES, calls, cpu, strict=True):
        per_call = spent / n * 1e6
        print(f"{mode:<24} {n:>8} {per_call:>12.1f} {per_call / off_us:>7.3f}")
    plane = planes[0]
    check_ns = min(timeit.repeat("plane.tracing is None", globals={"plane": plane}, number=1_000_000, repeat=5)) * 1e3
    print(f"the attribute check tracing-off calls pay: {check_ns:.0f} ns ({check_ns / 1e3 / off_us:.4%} of a call off)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    port = free_port()
    collector = subprocess.Popen([sys.executable, "-c", COLLECTOR, str(port)])
    try:
        asyncio.run(main(args.seconds, args.rounds, args.concurrency, f"http://127.0.0.1:{port}"))
    finally:
        collector.terminate()
        collector.wait()
