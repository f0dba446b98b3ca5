"""Cells, live: the controllers' CPU per request with one cell against two, at the same load.

For each layout, a server whose frontend runs in its own process and whose controllers are cell
processes (``serving.local_cells.Cells``, one cell or two), ``--devices`` emulated devices in worker processes
(``worker --emulate``, split over the cells), and ``mainspring bench`` sending Poisson arrivals at
``--rate`` for ``--duration-s`` over every model. Each cell process's CPU time (user + system, from
/proc) is read before and after; prints the controllers' summed CPU per request answered, goodput,
and the ratio of two cells' CPU per request to one's (aim: at most 1.2). The layouts alternate
``--rounds`` times, so the machine's noise falls on both.

    .venv/bin/python benchmarks/cells_live.py [--rate 300] [--duration-s 15] [--devices 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def cell_pids(front: int) -> list[int]:
    return [p for p in children(front) if b"serving.local_cells" in Path(f"/proc/{p}/cmdline").read_bytes()]


def wait_ready(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not get ready")


def run(cells: int, args: argparse.Namespace, base_port: int) -> dict[str, float]:
    http, grpc, workers_port = base_port, base_port + 1, base_port + 2
    front_code = (
        "from mainspring.serving.local_cells import run_cells; from mainspring.serving.config import ServeConfig; "
        f"raise SystemExit(run_cells(ServeConfig(cells={cells}, workers='tcp', allow_open_workers=True, frontends=1, "
        f"http_port={http}, grpc_port={grpc}, worker_port={workers_port}, repo={args.repo!r}, slo_ms={args.slo_ms})))"
    )
    logs = Path(args.log_dir)
    front = subprocess.Popen([sys.executable, "-c", front_code], stdout=(logs / f"front-{cells}.log").open("wb"),
                             stderr=subprocess.STDOUT)  # fmt: skip
    per_cell = args.devices // cells
    workers = [
        subprocess.Popen([sys.executable, "-m", "mainspring.cli", "worker", "--controller",
                          f"tcp://127.0.0.1:{workers_port + i}", "--emulate", "--count", str(per_cell), "--models",
                          str(args.models), "--name", f"emulated-{i}"],
                         stdout=(logs / f"worker-{cells}-{i}.log").open("wb"), stderr=subprocess.STDOUT)
        for i in range(cells)
    ]  # fmt: skip
    try:
        wait_ready(http)
        pids = cell_pids(front.pid)
        before = sum(cpu_s(p) for p in pids)
        report = Path(args.log_dir) / f"bench-{cells}.json"
        subprocess.run([sys.executable, "-m", "mainspring.cli", "bench", "--url", f"127.0.0.1:{http}", "--rate",
                        str(args.rate), "--duration-s", str(args.duration_s), "--slo-ms", str(args.slo_ms),
                        "--json", str(report), "--quiet"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        used = sum(cpu_s(p) for p in pids) - before
        result = json.loads(report.read_text())
        answered = result["requests"]
        return {"cpu_us": 1e6 * used / max(answered, 1), "answered": answered,
                "goodput": result["goodput_rps"], "offered": result["offered_rps"]}  # fmt: skip
    finally:
        for worker in workers:
            worker.terminate()
        front.terminate()
        front.wait(60)
        for worker in workers:
            worker.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--slo-ms", type=float, default=200.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base-port", type=int, default=28000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        args.repo = str(Path(scratch) / "repo")
        Path(args.repo).mkdir()
        args.log_dir = scratch
        print(f"{'round':>5} {'cells':>5} {'answered':>8} {'goodput r/s':>11} {'controllers us/req':>18}")
        per_request: dict[int, list[float]] = {1: [], 2: []}
        for round_ in range(args.rounds):
            for cells in (1, 2):
                m = run(cells, args, args.base_port + 10 * cells)
                per_request[cells].append(m["cpu_us"])
                print(f"{round_:>5} {cells:>5} {m['answered']:>8.0f} {m['goodput']:>11.1f} {m['cpu_us']:>18.1f}",
                      flush=True)  # fmt: skip
    one, two = (sum(v) / len(v) for v in (per_request[1], per_request[2]))
    print(f"two cells' controller CPU per request over one cell's: {two / one:.2f} (aim: at most 1.2)")


if __name__ == "__main__":
    main()
