"""Past the live knee: goodput, admitted attainment and refusal latency, with shedding at arrival on and off.

Issue 56's setup: ``mainspring serve --workers tcp`` (the frontend in the controller's process unless
``--frontends``), one ``mainspring worker --emulate --count 8 --models 200`` (emulated V100s in a process
of their own), Poisson load over every model at a 100 ms SLO from this process's driver (as ``mainspring
bench``). For each setting of ``shed_at_arrival`` in one run: a ramp finds the knee (the rate where goodput
peaks), then 2x and 4x the knee. Prints, per load: goodput and its share of the peak, the attainment of the
admitted calls (those not refused at arrival), the p99 of the refusals' latency, the driver's send lag
(above 10 ms at p99, this machine cannot offer the rate and the row says so), and whether every call was
answered exactly once. Rows are printed as they are measured.

    .venv/bin/python benchmarks/overload_knee.py [--seconds 10] [--ramp 300,600,...] [--factors 2,4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from mainspring.bench.driver import Sent
from mainspring.protocol import ResponseStatus
from mainspring.time import NS_PER_MS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_rig import LiveServer, offer

SLO_MS = 100.0


def row(setting: str, label: str, rate: float, report: dict[str, object], sent: list[Sent], peak: float) -> str:
    admitted = [s for s in sent if s.status is not ResponseStatus.REJECTED]
    refusals = sorted(s.answered_ns - s.sent_ns for s in sent if s.status is ResponseStatus.REJECTED)
    refusal_p99 = refusals[int(0.99 * (len(refusals) - 1))] / NS_PER_MS if refusals else 0.0
    on_time = sum(s.good for s in admitted) / len(admitted) if admitted else 0.0
    lag = report["send_lag_ms"]["p99"]  # type: ignore[index]
    goodput = float(report["goodput_rps"])  # type: ignore[arg-type]
    once = "yes" if report["unanswered"] == 0 else f"no ({report['unanswered']} unanswered)"
    short = " (cannot offer it: send lag)" if lag > 10 else ""
    return (f"| {setting} | {label} | {rate:.0f}{short} | {goodput:.0f} | {goodput / peak:.0%} | {on_time:.2%} "
            f"| {len(refusals)} | {refusal_p99:.1f} | {lag:.1f} | {once} |")  # fmt: skip


def measure(shed: bool, args: argparse.Namespace, folder: Path) -> None:
    setting = f"shed {'on' if shed else 'off'}"
    setup = LiveServer(folder, {"shed_at_arrival": shed}, frontends=args.frontends, tag=f"-shed-{shed}")
    try:
        asyncio.run(offer(setup.http, 100.0, 3.0, 0))  # warm-up: the models' first loads
        ramp = []
        for rate in args.ramp:
            report, sent = asyncio.run(offer(setup.http, rate, args.seconds, 1))
            ramp.append((rate, report, sent))
        knee, peak_report, _ = max(ramp, key=lambda r: float(r[1]["goodput_rps"]))  # type: ignore[arg-type]
        peak = float(peak_report["goodput_rps"])  # type: ignore[arg-type]
        for rate, report, sent in ramp:
            print(row(setting, "ramp" + (" (knee)" if rate == knee else ""), rate, report, sent, peak), flush=True)
        for factor in args.factors:
            report, sent = asyncio.run(offer(setup.http, factor * knee, args.seconds, 2))
            print(row(setting, f"{factor:g}x knee", factor * knee, report, sent, peak), flush=True)
    finally:
        setup.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--ramp", type=lambda t: [float(x) for x in t.split(",")],
                        default=[300.0, 600.0, 900.0, 1200.0, 1500.0, 1800.0])  # fmt: skip
    parser.add_argument("--factors", type=lambda t: [float(x) for x in t.split(",")], default=[2.0, 4.0])
    parser.add_argument("--frontends", type=int, default=1)
    parser.add_argument("--shed", choices=["both", "on", "off"], default="both")
    args = parser.parse_args()
    print(f"8 emulated V100s, 200 models, SLO {SLO_MS:g} ms, {args.seconds:g} s a load, frontends {args.frontends}")
    print("| setting | load | offered r/s | goodput r/s | of peak | admitted on time | refused | refusal p99 ms "
          "| send lag p99 ms | each answered once |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for shed in {"both": (True, False), "on": (True,), "off": (False,)}[args.shed]:
            measure(shed, args, Path(folder))


if __name__ == "__main__":
    main()
