"""Overload without collapse, live: goodput and every process's memory against offered load.

Starts ``mainspring serve`` (one CPU worker) on the zoo's resnet18 (224x224), measures its
capacity at the SLO with a closed loop (``--clients`` clients), then offers Poisson load at
1x, 2x, 5x and 10x that capacity with ``mainspring bench``'s driver, in one run. Prints per
load: goodput (and as a share of the goodput at capacity), attainment, how the excess was
answered (rejected at once with the reason, timed out, errors), the driver's send lag, and the
peak resident memory of the server and the worker during that load (sampled every 0.2 s).

    .venv/bin/python benchmarks/overload_live.py [--policy clockwork] [--slo-ms 250] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from mainspring.bench.driver import drive
from mainspring.bench.report import build
from mainspring.bench.senders import HttpSender
from mainspring.models.loading import export_zoo_model
from mainspring.models.profile import ModelProfile
from mainspring.models.repository import ModelRepository
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import ClosedLoop, PoissonOpenLoop, Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.serving.processes import ServerProcess, child_pids, rss_mib

MODEL = "resnet18"


class PeakMemory:
    """Samples the resident memory of the server and its worker until stopped; keeps the peaks."""

    def __init__(self, server_pid: int) -> None:
        self.pids = {"server": server_pid, "worker": child_pids(server_pid)[0]}
        self.peaks = dict.fromkeys(self.pids, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            for name, pid in self.pids.items():
                self.peaks[name] = max(self.peaks[name], rss_mib(pid))


async def run_load(url: str, workload: Workload, seconds: float, slo_ms: float, seed: int) -> dict[str, Any]:
    sender = HttpSender(url)
    try:
        await sender.prepare([MODEL])
        duration = s_to_ns(seconds)
        arrivals = workload.arrivals([ModelProfile(MODEL, "live", 1, 1, {1: 1})], duration, random.Random(seed))
        return build(await drive(arrivals, workload, sender, ms_to_ns(slo_ms), duration))
    finally:
        await sender.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="clockwork")
    parser.add_argument("--slo-ms", type=float, default=250.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--capacity-rps", type=float, help="use this capacity, not the measured one (another policy's)")
    parser.add_argument("--factors", type=float, nargs="+", default=[1.0, 2.0, 5.0, 10.0])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = ModelRepository(Path(folder))
        export_zoo_model(repo, MODEL, args={"image_size": 224})
        server = ServerProcess(repo.root, Path(folder) / "server.log", "--policy", args.policy, "--slo-ms",
                               str(args.slo_ms))  # fmt: skip
        try:
            server.wait_ready()
            url = server.http
            asyncio.run(run_load(url, ClosedLoop(2), 5.0, args.slo_ms, 0))  # warm-up: measured estimates
            with PeakMemory(server.process.pid) as memory:
                capacity = asyncio.run(run_load(url, ClosedLoop(args.clients), args.seconds, args.slo_ms, 1))
            rows = [("capacity (closed loop)", capacity, dict(memory.peaks))]
            base = args.capacity_rps or capacity["goodput_rps"]
            for factor in args.factors:
                with PeakMemory(server.process.pid) as memory:
                    load = PoissonOpenLoop(factor * base)
                    rows.append((f"{factor:g}x", asyncio.run(run_load(url, load, args.seconds, args.slo_ms, 2)),
                                 dict(memory.peaks)))  # fmt: skip
        finally:
            server.stop()
    print(
        f"policy {args.policy}, {MODEL} 224x224 on one CPU worker, SLO {args.slo_ms:g} ms, {args.seconds:g} s per load"
    )
    print(
        "| offered | r/s | goodput r/s | of capacity | attainment | rejected | timed out | errors | send lag p99 ms "
        "| server MiB | worker MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, report, peaks in rows:
        print(f"| {name} | {report['offered_rps']:.1f} | {report['goodput_rps']:.1f} | "
              f"{report['goodput_rps'] / base:.0%} | {report['slo_attainment']:.1%} | {report['rejected']} | "
              f"{report['timed_out']} | {report['errors']} | {report['send_lag_ms']['p99']:.2f} | "
              f"{peaks['server']:.0f} | {peaks['worker']:.0f} |")  # fmt: skip
    for name, report, _ in rows[1:]:
        print(f"{name}: " + ", ".join(f"{count} {reason}" for reason, count in report["reasons"].items()))


if __name__ == "__main__":
    main()
