"""What an open live page costs the controller: its CPU per answered request at a steady load (1,000 r/s by
default) with a page polling and without, side by side in one run, on one server.

The rig is ``live_rig.LiveServer``: the controller in a process of its own (one cell, ``cpu_ledger`` on), the
frontend in another, 8 emulated V100s in a worker process, 200 models, SLO 100 ms. The page is stood in for by
a process that fetches what the page's script fetches, every 500 ms (``GET /dashboard/timeline?seconds=30``,
then with the cursor each view gives): the controller cannot tell it from a browser, and a browser on this
machine would take CPU from the controller. Two figures:

- the controller's CPU per answered request with the page polling against without: loads with and without
  alternate (``--rounds`` of each), so drift of a shared machine falls on both; on a busy machine their
  difference is mostly noise;
- what the page costs the controller, over all of the controller's CPU while it polled: its polls (the ledger's
  ``page`` part: making each poll's view and sending it) and the answers kept for it (the controller keeps a
  row per answer only while a page polls: the ledger's ``metrics`` part, the observers', with against without;
  a round without the page starts 31 s after the last poll, once the controller stopped keeping them). Ledger
  parts are CPU time of the controller's loop: close to exact whatever the machine's noise.

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
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from controller_cost_live import ledger_s
from live_rig import LiveServer, offer

POLL_S = 0.5  # the page's (dashboard.js)
PAGE_SECONDS = 30  # what the page asks for (it shows 5, 10 or 30 s of it)
WATCHED_S = 31.0  # how long the controller keeps answers after a page's last poll, and a second


def poll(url: str, stats: Path) -> None:
    """Fetch ``url`` every ``POLL_S``, following the cursor, until killed; the count, failures, mean bytes and mean
    ms so far go to ``stats``."""
    sizes: list[int] = []
    took: list[float] = []
    cursor, failed, why = "", 0, ""
    while True:
        began = time.monotonic()
        try:
            with urllib.request.urlopen(f"{url}&cursor={cursor}", timeout=10) as response:
                body = response.read()
            cursor = json.loads(body)["cursor"]
            sizes.append(len(body))
            took.append(time.monotonic() - began)
        except OSError as error:
            failed += 1  # refused or slow under the load: the page tries again, as this does
            why = str(error) + (f": {error.read()[:200]!r}" if isinstance(error, urllib.error.HTTPError) else "")
        if sizes:
            after_first = statistics.fmean(sizes[1:] or sizes)  # the first poll brings the whole window
            written = stats.with_suffix(".new")  # then renamed: the poller is killed at any moment
            written.write_text(json.dumps({"polls": len(sizes), "failed": failed, "why": why, "bytes": after_first,
                                           "ms": 1000 * statistics.fmean(took)}))  # fmt: skip
            written.replace(stats)
        time.sleep(max(0.0, POLL_S - (time.monotonic() - began)))


def measure(server: LiveServer, rate: float, seconds: float, seed: int) -> dict[str, float]:
    """One load: the controller's CPU us per answered request, the ledger's page and metrics parts of it, and the
    attainment."""
    before, parts_before = server.controllers_cpu_s(), ledger_s(server)
    report, _ = asyncio.run(offer(server.http, rate, seconds, seed))
    spent, parts = server.controllers_cpu_s() - before, ledger_s(server)
    answered = int(report["requests"]) - int(report["unanswered"])  # type: ignore[call-overload]
    per = 1e6 / max(answered, 1)
    page, metrics = ((parts.get(p, 0.0) - parts_before.get(p, 0.0)) * per for p in ("page", "metrics"))
    return {"us": spent * per, "page_us": page, "metrics_us": metrics, "attainment": float(report["slo_attainment"])}  # type: ignore[arg-type]


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
        server = LiveServer(Path(folder), {"cpu_ledger": True}, cells=1)
        try:
            asyncio.run(offer(server.http, 100.0, 3.0, 0))  # warm-up: the models' first loads
            for round_ in range(args.rounds):
                if round_:  # the controller keeps answers for 30 s after a page's last poll (``ModelWindow``)
                    time.sleep(WATCHED_S)
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
        none = {"polls": 0, "failed": 0, "why": "", "bytes": 0.0, "ms": 0.0}
        polled = json.loads(stats.read_text()) if stats.exists() else none
    without = statistics.fmean(r["us"] for r in rows["without"])
    with_page = statistics.fmean(r["us"] for r in rows["with"])
    page = statistics.fmean(r["page_us"] for r in rows["with"])
    rows_kept = statistics.fmean(r["metrics_us"] for r in rows["with"]) - statistics.fmean(
        r["metrics_us"] for r in rows["without"]
    )  # the observers' part: the answers kept only while a page is open
    print(f"controller process CPU, us per answered request, at {args.rate:.0f} r/s (8 emulated V100s, 200 models, "
          f"SLO 100 ms; {args.rounds} x {args.seconds:g} s each, alternating)")  # fmt: skip
    print("| round | without the page | with the page polling | the page's part | observers without | observers with "
          "| attainment without | attainment with |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for i, (off, on) in enumerate(zip(rows["without"], rows["with"], strict=True)):
        print(f"| {i + 1} | {off['us']:.1f} | {on['us']:.1f} | {on['page_us']:.2f} | {off['metrics_us']:.2f} "
              f"| {on['metrics_us']:.2f} | {off['attainment']:.2%} | {on['attainment']:.2%} |")  # fmt: skip
    print(f"| mean | {without:.1f} | {with_page:.1f} | {page:.2f} | | | | |")
    cost = page + max(rows_kept, 0.0)
    print(f"the page's cost: {cost / with_page:.2%} of the controller's CPU while it polled (aim: at most 2%): its "
          f"polls {page:.2f} us a request (ledger part 'page') and the answers kept for it {rows_kept:+.2f} us "
          f"(part 'metrics', with against without); the totals with against without: {with_page / without - 1:+.2%} "
          "(the machine's noise included)")  # fmt: skip
    failed = f"{polled['failed']} failed" + (f", the last: {polled['why']}" if polled["failed"] else "")
    print(f"the last round's page: {polled['polls']} polls ({failed}), {polled['bytes'] / 1e3:.0f} kB a poll after "
          f"the first, answered in {polled['ms']:.1f} ms on average")  # fmt: skip


if __name__ == "__main__":
    main()
