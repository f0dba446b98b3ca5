"""What an open live page costs the controller: its CPU per answered request at a steady load (1,000 r/s by
default) with a page polling and without, side by side in one run, on one server.

The rig is ``live_rig.LiveServer``: the controller in a process of its own (one cell), the frontend in
another, 8 emulated V100s in a worker process, 200 models, SLO 100 ms. The page is stood in for by a process
that fetches what the page fetches (``GET /dashboard/timeline?seconds=10``, its default) every 500 ms, as the
page's script does: the controller cannot tell it from a browser, and a browser on this machine would take CPU
from the controller. Loads with and without the page alternate (``--rounds`` of each), so drift of a shared
machine falls on both; the figure is the controller's CPU with the page over without it, less one.

    .venv/bin/python benchmarks/dashboard_cost.py [--rate 1000] [--seconds 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_rig import LiveServer, offer

POLL_S = 0.5  # the page's (dashboard.js)
PAGE_SECONDS = 10  # the page's default window


def poll(url: str, stats: Path) -> None:
    """Fetch ``url`` every ``POLL_S`` until killed, writing the count, mean bytes and mean ms so far to ``stats``."""
    sizes: list[int] = []
    took: list[float] = []
    while True:
        began = time.monotonic()
        with urllib.request.urlopen(url, timeout=10) as response:
            sizes.append(len(response.read()))
        took.append(time.monotonic() - began)
        stats.write_text(json.dumps({"polls": len(sizes), "bytes": statistics.fmean(sizes),
                                     "ms": 1000 * statistics.fmean(took)}))  # fmt: skip
        time.sleep(max(0.0, POLL_S - (time.monotonic() - began)))


def measure(server: LiveServer, rate: float, seconds: float, seed: int) -> dict[str, float]:
    """One load: the controller's CPU us per answered request, and the attainment."""
    before = server.controllers_cpu_s()
    report, _ = asyncio.run(offer(server.http, rate, seconds, seed))
    spent = server.controllers_cpu_s() - before
    answered = int(report["requests"]) - int(report["unanswered"])  # type: ignore[call-overload]
    return {"us": spent * 1e6 / max(answered, 1), "attainment": float(report["slo_attainment"])}  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--poll", nargs=2, metavar=("URL", "STATS"), help=argparse.SUPPRESS)  # the page's stand-in
    args = parser.parse_args()
    if args.poll:
        poll(args.poll[0], Path(args.poll[1]))
        return
    rows: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as folder:
        stats = Path(folder) / "poll.json"
        server = LiveServer(Path(folder), cells=1)
        try:
            asyncio.run(offer(server.http, 100.0, 3.0, 0))  # warm-up: the models' first loads
            for round_ in range(args.rounds):
                rows["without"].append(measure(server, args.rate, args.seconds, round_))
                url = f"http://127.0.0.1:{server.http}/dashboard/timeline?seconds={PAGE_SECONDS}"
                page = subprocess.Popen([sys.executable, __file__, "--poll", url, str(stats)])
                try:
                    time.sleep(1.0)  # its first polls in, a window of traffic behind them
                    rows["with"].append(measure(server, args.rate, args.seconds, round_))
                finally:
                    page.kill()
                    page.wait()
        finally:
            server.stop()
        polled = json.loads(stats.read_text()) if stats.exists() else {"polls": 0, "bytes": 0.0, "ms": 0.0}
    without = statistics.fmean(r["us"] for r in rows["without"])
    with_page = statistics.fmean(r["us"] for r in rows["with"])
    print(f"controller process CPU, us per answered request, at {args.rate:.0f} r/s (8 emulated V100s, 200 models, "
          f"SLO 100 ms; {args.rounds} x {args.seconds:g} s each, alternating)")  # fmt: skip
    print("| round | without the page | with the page polling | attainment without | attainment with |")
    print("|---|---|---|---|---|")
    for i, (off, on) in enumerate(zip(rows["without"], rows["with"], strict=True)):
        print(f"| {i + 1} | {off['us']:.1f} | {on['us']:.1f} | {off['attainment']:.2%} | {on['attainment']:.2%} |")
    print(f"| mean | {without:.1f} | {with_page:.1f} | | |")
    print(f"the page's cost: {with_page / without - 1:+.2%} of the controller's CPU (aim: at most +2%); "
          f"its data {polled['bytes'] / 1e3:.0f} kB a poll, answered in {polled['ms']:.1f} ms on average")  # fmt: skip


if __name__ == "__main__":
    main()
