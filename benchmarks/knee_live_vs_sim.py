"""Fig. 11 live, on this machine: where goodput peaks with cells in their own processes, beside the
simulator's prediction for the same devices, models and arrivals.

For each layout (``--cells``): a live server whose frontend is the serve process and whose controllers
are cell processes (``live_rig.LiveServer``: ``--devices`` emulated V100s in worker processes, one per
cell, ``--models`` each), warmed up, then a ramp of Poisson rates over every model at a ``--slo-ms`` SLO,
``--seconds`` each, from this process's driver. Then the simulator on the same setting
(``simulate(..., cells=CellsConfig(N))``: the policy's calls, the live process around them and a
frontend core, ``cells/cost.py``'s ``LIVE_COST``), each rate a fresh run with a warm-up at that rate.
Prints goodput and attainment per rate, live and simulated, each side's knee (the rate where goodput
peaks) and the simulated knee's ratio to the live one (aim: within 25%). The live rows come first, all
of them, so that the simulations do not share the machine with the live servers.

    .venv/bin/python benchmarks/knee_live_vs_sim.py [--cells 1,2] [--rates 400,800,...] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.sim.cells import CellsConfig
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import PoissonOpenLoop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_rig import LiveServer, offer

Row = tuple[float, float, float]  # offered r/s, goodput r/s, attainment


def live(cells: int, args: argparse.Namespace, folder: Path) -> list[Row]:
    server = LiveServer(folder, frontends=1, cells=cells, devices=args.devices, models=args.models,
                        slo_ms=args.slo_ms, tag=f"-cells-{cells}")  # fmt: skip
    rows = []
    try:
        asyncio.run(offer(server.http, 100.0, 3.0, 0, args.slo_ms))  # warm-up: the models' first loads
        for rate in args.rates:
            report, _ = asyncio.run(offer(server.http, rate, args.seconds, 1, args.slo_ms))
            rows.append((rate, float(report["goodput_rps"]), float(report["slo_attainment"])))  # type: ignore[arg-type]
            print(f"live, {cells} cell(s): {rate:.0f} r/s -> {rows[-1][1]:.0f} r/s ({rows[-1][2]:.2%})", flush=True)
    finally:
        server.stop()
    return rows


def simulated(cells: int, args: argparse.Namespace) -> list[Row]:
    models = model_copies(builtin_profiles(), args.models)
    rows = []
    for rate in args.rates:
        config = SimulationConfig(duration_ns=s_to_ns(args.seconds), warmup_ns=s_to_ns(args.warmup_s),
                                  devices=args.devices, seed=1, slo_ns=ms_to_ns(args.slo_ms))  # fmt: skip
        report = simulate("clockwork", models, PoissonOpenLoop(rate), config, cells=CellsConfig(cells)).report
        rows.append((rate, report.goodput_rps, report.slo_attainment))
        print(f"simulated, {cells} cell(s): {rate:.0f} r/s -> {rows[-1][1]:.0f} r/s ({rows[-1][2]:.2%})", flush=True)
    return rows


def knee(rows: list[Row]) -> Row:
    return max(rows, key=lambda row: row[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    numbers = lambda text: [float(x) for x in text.split(",")]  # noqa: E731
    parser.add_argument("--cells", type=lambda t: [int(x) for x in t.split(",")], default=[1, 2])
    parser.add_argument("--rates", type=numbers, default=[400.0, 800.0, 1200.0, 1600.0, 2000.0, 2400.0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup-s", type=float, default=2.0, help="the simulator's warm-up at each rate")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--slo-ms", type=float, default=100.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        measured = {cells: live(cells, args, Path(folder)) for cells in args.cells}
    predicted = {cells: simulated(cells, args) for cells in args.cells}
    print(f"\n{args.devices} emulated V100s, {args.models} models, SLO {args.slo_ms:g} ms, {args.seconds:g} s a rate")
    print("| cells | offered r/s | live goodput r/s | live attainment | simulated goodput r/s | simulated attainment |")
    print("|---|---|---|---|---|---|")
    for cells in args.cells:
        for (rate, good, share), (_, sim_good, sim_share) in zip(measured[cells], predicted[cells], strict=True):
            print(f"| {cells} | {rate:.0f} | {good:.0f} | {share:.2%} | {sim_good:.0f} | {sim_share:.2%} |")
    print("\n| cells | live knee r/s (goodput) | simulated knee r/s (goodput) | simulated / live |")
    print("|---|---|---|---|")
    for cells in args.cells:
        (live_rate, live_good, _), (sim_rate, sim_good, _) = knee(measured[cells]), knee(predicted[cells])
        print(f"| {cells} | {live_rate:.0f} ({live_good:.0f}) | {sim_rate:.0f} ({sim_good:.0f}) | "
              f"{sim_good / max(live_good, 1e-9):.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
