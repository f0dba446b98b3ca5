"""The live controller's whole cost: its process's CPU per answered request, split by part.

Issue 56's setup: one cell (``serving.local_cells`` with one cell: the controller in a process of its own,
the frontend in the serve process; ``--cells 0`` puts the controller in the frontend's process), one
``mainspring worker --emulate --count 8 --models 200`` (emulated V100s in a process of their own), and
Poisson load over every model at a 100 ms SLO from this process's driver. For each rate, the controller
process's CPU (user + system, all its threads, from /proc) over the run, per request answered (and the
frontend process's, with cells), with:

- the split by part (``cpu_ledger`` on: ``mainspring_controller_cpu_seconds{part}``): receive (decoding
  what frontends and workers send, and handing it on), admission, the policy (its calls and the pass),
  send (encoding and sending actions), results (checking results, taking their outputs), answer (answering
  the calls: futures, encoding and sending the answers), metrics (the observers: Prometheus, the live page's
  rows), page (the live page's polls: a view made and sent), signal
  (a cell's load signal, computed every 5 ms and sent when it changed);
  unattributed: the event loop's own work between them (tasks, futures, timers, ZeroMQ's asyncio glue);
  other threads: the rest of the process (ZeroMQ's I/O threads, the garbage collector's pauses are in the
  loop's parts);
- the total again with the ledger off (a second server, in the same run), which is the cost a user pays;
  the ledger's own cost is the difference (about 2 us a part).

    .venv/bin/python benchmarks/controller_cost_live.py [--rates 300,600,900] [--seconds 10] [--json rows.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_rig import LiveServer, cpu_s, offer

PARTS = ("receive", "admission", "policy", "send", "results", "answer", "metrics", "page", "signal", "unattributed")
_SAMPLE = re.compile(rb'^mainspring_controller_cpu_seconds\{[^}]*part="(\w+)"[^}]*\} (\S+)$', re.MULTILINE)


def ledger_s(server: LiveServer) -> dict[str, float]:
    """The controllers' CPU by part so far, summed over the cells."""
    total: dict[str, float] = {}
    for part, value in _SAMPLE.findall(server.metrics_text()):
        total[part.decode()] = total.get(part.decode(), 0.0) + float(value)
    return total


def counted(server: LiveServer, name: bytes) -> float:
    """A metric summed over its label sets (and the cells)."""
    found = re.findall(rb"^" + name + rb"(?:\{[^}]*\})? (\S+)$", server.metrics_text(), re.MULTILINE)
    return sum(float(value) for value in found)


def measure(server: LiveServer, rate: float, seconds: float, seed: int) -> dict[str, float]:
    """One load: CPU us per answered request of the controller processes, each part's (when the ledger is on)
    and the frontend's (with cells); and the raw figures a fit needs, per second of the run."""
    frontend = server.server.pid if server.cells else None
    before_cpu, before = server.controllers_cpu_s(), ledger_s(server)
    before_front = cpu_s(frontend) if frontend else 0.0
    before_actions = counted(server, b"mainspring_actions_total")
    started = time.monotonic()
    report, _ = asyncio.run(offer(server.http, rate, seconds, seed))
    elapsed = time.monotonic() - started
    after_cpu, after = server.controllers_cpu_s(), ledger_s(server)
    after_front = cpu_s(frontend) if frontend else 0.0
    actions = counted(server, b"mainspring_actions_total") - before_actions
    answered = int(report["requests"]) - int(report["unanswered"])  # type: ignore[call-overload]
    per = 1e6 / max(answered, 1)
    row = {"rate": rate, "seconds": elapsed, "answered": answered, "actions": actions,
           "goodput": float(report["goodput_rps"]), "attainment": float(report["slo_attainment"]),  # type: ignore[arg-type]
           "controller_cpu_s": after_cpu - before_cpu, "frontend_cpu_s": after_front - before_front,
           "total": (after_cpu - before_cpu) * per, "frontend": (after_front - before_front) * per}  # fmt: skip
    if after:
        for part in PARTS:
            row[part + "_cpu_s"] = after.get(part, 0.0) - before.get(part, 0.0)
            row[part] = row[part + "_cpu_s"] * per
        row["other threads"] = row["total"] - sum(row[p] for p in PARTS)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",")], default=[300.0, 600.0, 900.0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--frontends", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write every row (the raw figures per load) here")
    parser.add_argument("--cells", type=int, default=1, help="controller processes (0: in the frontend's process)")
    args = parser.parse_args()
    rows: dict[tuple[str, float], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for ledger in ("true", "false"):
            server = LiveServer(Path(folder), {"cpu_ledger": ledger == "true"}, frontends=args.frontends,
                                cells=args.cells, tag=f"-ledger-{ledger}")  # fmt: skip
            try:
                asyncio.run(offer(server.http, 100.0, 3.0, 0))  # warm-up: the models' first loads
                for rate in args.rates:
                    rows[ledger, rate] = measure(server, rate, args.seconds, 1)
            finally:
                server.stop()
    if args.json:
        args.json.write_text(json.dumps([{"ledger": ledger, **row} for (ledger, _), row in rows.items()], indent=1))
    print(f"controller process CPU, us per answered request (8 emulated V100s, 200 models, SLO 100 ms, "
          f"{args.seconds:g} s a rate, frontends {args.frontends})")  # fmt: skip
    columns = [*PARTS, "other threads"]
    print("| offered r/s | goodput r/s | attainment | frontend | total, ledger off | total, ledger on | "
          + " | ".join(columns) + " |")  # fmt: skip
    print("|---" * (6 + len(columns)) + "|")
    for rate in args.rates:
        on, off = rows["true", rate], rows["false", rate]
        parts = " | ".join(f"{on[c]:.0f}" for c in columns)
        print(f"| {rate:.0f} | {off['goodput']:.0f} | {off['attainment']:.2%} | {off['frontend']:.0f} "
              f"| {off['total']:.0f} | {on['total']:.0f} | {parts} |")  # fmt: skip


if __name__ == "__main__":
    main()
