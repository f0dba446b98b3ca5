"""The live controller's whole cost: its process's CPU per answered request, split by part.

Issue 56's setup: ``mainspring serve --workers tcp --frontends 1`` (the frontend in a process of its own),
one ``mainspring worker --emulate --count 8 --models 200`` (emulated V100s in a process of their own), and
Poisson load over every model at a 100 ms SLO from this process's driver. For each rate, the controller
process's CPU (user + system, all its threads, from /proc) over the run, per request answered, with:

- the split by part (``cpu_ledger`` on: ``mainspring_controller_cpu_seconds{part}``): receive (decoding
  what frontends and workers send, and handing it on), admission, the policy (its calls and the pass),
  send (encoding and sending actions), results (checking results, taking their outputs), answer (answering
  the calls: futures, encoding and sending the answers), metrics (Prometheus, the live timeline);
  unattributed: the event loop's own work between them (tasks, futures, timers, ZeroMQ's asyncio glue);
  other threads: the rest of the process (ZeroMQ's I/O threads, the garbage collector's pauses are in the
  loop's parts);
- the total again with the ledger off (a second server, in the same run), which is the cost a user pays;
  the ledger's own cost is the difference (about 2 us a part).

    .venv/bin/python benchmarks/controller_cost_live.py [--rates 300,600,900] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_rig import LiveServer, offer

PARTS = ("receive", "admission", "policy", "send", "results", "answer", "metrics", "unattributed")
_SAMPLE = re.compile(rb'^mainspring_controller_cpu_seconds\{part="(\w+)"\} (\S+)$', re.MULTILINE)


def ledger_s(server: LiveServer) -> dict[str, float]:
    return {part.decode(): float(value) for part, value in _SAMPLE.findall(server.metrics_text())}


def measure(server: LiveServer, rate: float, seconds: float, seed: int) -> dict[str, float]:
    """CPU us per answered request over one load: the process's, and each part's (when the ledger is on)."""
    before_cpu, before = server.controllers_cpu_s(), ledger_s(server)
    report, _ = asyncio.run(offer(server.http, rate, seconds, seed))
    after_cpu, after = server.controllers_cpu_s(), ledger_s(server)
    answered = int(report["requests"]) - int(report["unanswered"])  # type: ignore[call-overload]
    per = 1e6 / max(answered, 1)
    row = {"answered": answered, "goodput": float(report["goodput_rps"]),  # type: ignore[arg-type]
           "attainment": float(report["slo_attainment"]), "total": (after_cpu - before_cpu) * per}  # type: ignore[arg-type]  # fmt: skip
    if after:
        for part in PARTS:
            row[part] = (after.get(part, 0.0) - before.get(part, 0.0)) * per
        row["other threads"] = row["total"] - sum(row[p] for p in PARTS)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",")], default=[300.0, 600.0, 900.0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--frontends", type=int, default=1)
    args = parser.parse_args()
    rows: dict[tuple[str, float], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for ledger in ("true", "false"):
            server = LiveServer(Path(folder), {"MAINSPRING_CPU_LEDGER": ledger}, frontends=args.frontends,
                                tag=f"-ledger-{ledger}")  # fmt: skip
            try:
                asyncio.run(offer(server.http, 100.0, 3.0, 0))  # warm-up: the models' first loads
                for rate in args.rates:
                    rows[ledger, rate] = measure(server, rate, args.seconds, 1)
            finally:
                server.stop()
    print(f"controller process CPU, us per answered request (8 emulated V100s, 200 models, SLO 100 ms, "
          f"{args.seconds:g} s a rate, frontends {args.frontends})")  # fmt: skip
    columns = [*PARTS, "other threads"]
    print("| offered r/s | goodput r/s | attainment | total, ledger off | total, ledger on | "
          + " | ".join(columns) + " |")  # fmt: skip
    print("|---" * (5 + len(columns)) + "|")
    for rate in args.rates:
        on, off = rows["true", rate], rows["false", rate]
        parts = " | ".join(f"{on[c]:.0f}" for c in columns)
        print(f"| {rate:.0f} | {off['goodput']:.0f} | {off['attainment']:.2%} | {off['total']:.0f} | "
              f"{on['total']:.0f} | {parts} |")  # fmt: skip


if __name__ == "__main__":
    main()
