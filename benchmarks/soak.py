"""Soak: the Azure replay against the live server for a long time, its worker killed every few minutes.

Starts ``mainspring serve`` on the built-in zoo (one local CPU worker, restarted by the server
when it dies), replays the bundled Azure Functions sample over the zoo's models at ``--scale``
with ``mainspring bench``'s driver, and SIGKILLs the worker every ``--kill-every-s``. Reports
requests sent and answered (every one must be answered: a result, a rejection or an error),
attainment, answers by reason, and the resident memory of each process per minute, so that
growth shows.

    .venv/bin/python benchmarks/soak.py [--minutes 30] [--scale 2] [--kill-every-s 180]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from mainspring.bench.driver import drive
from mainspring.bench.report import build, format_report
from mainspring.bench.senders import HttpSender
from mainspring.models.loading import export_zoo_model
from mainspring.models.profile import ModelProfile
from mainspring.models.repository import ModelRepository
from mainspring.serving.config import DEFAULT_ZOO
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import AzureTrace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.serving.processes import ServerProcess, child_pids, rss_mib


class Chaos:
    """Kills the server's worker every ``period_s`` and samples every process's memory each second."""

    def __init__(self, server_pid: int, period_s: float) -> None:
        self.server_pid = server_pid
        self.period_s = period_s
        self.kills = 0
        self.memory: list[tuple[float, float, float]] = []  # (seconds, server MiB, worker MiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Chaos:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        began = time.monotonic()
        next_kill = began + self.period_s
        while not self._stop.wait(1.0):
            workers = child_pids(self.server_pid)
            worker_mib = sum(rss_mib(pid) for pid in workers)
            self.memory.append((time.monotonic() - began, rss_mib(self.server_pid), worker_mib))
            if time.monotonic() >= next_kill and workers:
                os.kill(workers[0], signal.SIGKILL)
                self.kills += 1
                next_kill += self.period_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--scale", type=float, default=2.0)
    parser.add_argument("--start-minute", type=int, default=0)
    parser.add_argument("--kill-every-s", type=float, default=180.0)
    parser.add_argument("--slo-ms", type=float, default=100.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = ModelRepository(Path(folder))
        for model in DEFAULT_ZOO:
            export_zoo_model(repo, model)
        server = ServerProcess(repo.root, Path(folder) / "server.log", "--slo-ms", str(args.slo_ms))
        try:
            server.wait_ready()
            workload = AzureTrace(None, args.scale, args.start_minute)
            profiles = [ModelProfile(m, "live", 1, 1, {1: 1}) for m in DEFAULT_ZOO]
            duration = s_to_ns(args.minutes * 60)

            async def replay() -> dict[str, object]:
                sender = HttpSender(server.http)
                try:
                    await sender.prepare(list(DEFAULT_ZOO))
                    arrivals = workload.arrivals(profiles, duration, random.Random(1))
                    return build(await drive(arrivals, workload, sender, ms_to_ns(args.slo_ms), duration))
                finally:
                    await sender.close()

            with Chaos(server.process.pid, args.kill_every_s) as chaos:
                report = asyncio.run(replay())
            restarts = (Path(folder) / "server.log").read_text().count("started again")
        finally:
            server.stop()
    print(f"Azure sample x{args.scale:g} from minute {args.start_minute}, {args.minutes:g} min, zoo {DEFAULT_ZOO}, "
          f"SLO {args.slo_ms:g} ms; worker killed {chaos.kills} times (started again {restarts} times)")  # fmt: skip
    print(format_report(report))
    print(f"answered {report['requests'] - report['unanswered']} of {report['requests']} requests")
    print("minute | server MiB (max) | worker MiB (max)")
    for minute in range(int(args.minutes) + 1):
        window = [m for m in chaos.memory if minute * 60 <= m[0] < (minute + 1) * 60]
        if window:
            print(f"{minute:>6} | {max(m[1] for m in window):>16.0f} | {max(m[2] for m in window):>16.0f}")


if __name__ == "__main__":
    main()
