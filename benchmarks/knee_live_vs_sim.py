"""Fig. 11 live, on this machine: where goodput peaks with cells in their own processes, beside the
simulator's prediction for the same devices, models and arrivals.

For each layout (``--cells``): a live server whose frontend is the serve process and whose controllers
are cell processes (``live_rig.LiveServer``: ``--devices`` emulated V100s in worker processes, one per
cell, ``--models`` each), warmed up, then a ramp of Poisson rates over every model at a ``--slo-ms`` SLO,
``--seconds`` each, from this process's driver. Then the simulator on the same setting
(``simulate(..., cells=CellsConfig(N))``: the policy's calls, the live process around them and a
frontend core, ``cells/cost.py``'s ``LIVE_COST``), each rate a fresh run with a warm-up at that rate:
once with a core for each process (a production server), once on this machine's cores shared with the
emulated workers and the load generator as busy as they were live at that rate (``sim/machine.py``).
Prints goodput and attainment per rate, live and simulated, each side's knee (the rate where goodput
peaks) and the ratio of this machine's simulated knee to the live one (aim: within 25%). The live rows come first, all
of them, so that the simulations do not share the machine with the live servers.

    .venv/bin/python benchmarks/knee_live_vs_sim.py [--cells 1,2] [--rates 400,800,...] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.sim.cells import CellsConfig
from mainspring.sim.machine import MachineShare
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import PoissonOpenLoop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_rig import LiveServer, cpu_s, offer

Row = tuple[float, float, float]  # offered r/s, goodput r/s, attainment
PROCESSES = ("frontend", "controllers", "workers", "load generator")


def cpu_by_process(server: LiveServer) -> dict[str, float]:
    """CPU seconds so far of each kind of process on this machine: the serve process (the frontend), the cell
    processes, the emulated workers and this process (the load generator)."""
    own = os.times()
    workers = sum(cpu_s(w.pid) for w in server.workers)
    return {"frontend": cpu_s(server.server.pid), "controllers": server.controllers_cpu_s(), "workers": workers,
            "load generator": own.user + own.system}  # fmt: skip


def live(cells: int, args: argparse.Namespace, folder: Path) -> tuple[list[Row], list[dict[str, float]]]:
    """Goodput per rate, and each kind of process's CPU cores busy at that rate."""
    server = LiveServer(folder, frontends=1, cells=cells, devices=args.devices, models=args.models,
                        slo_ms=args.slo_ms, tag=f"-cells-{cells}")  # fmt: skip
    rows, busy = [], []
    try:
        asyncio.run(offer(server.http, 100.0, 3.0, 0, args.slo_ms))  # warm-up: the models' first loads
        for rate in args.rates:
            before, started = cpu_by_process(server), time.monotonic()
            report, _ = asyncio.run(offer(server.http, rate, args.seconds, 1, args.slo_ms))
            after, elapsed = cpu_by_process(server), time.monotonic() - started
            rows.append((rate, float(report["goodput_rps"]), float(report["slo_attainment"])))  # type: ignore[arg-type]
            busy.append({kind: (after[kind] - before[kind]) / elapsed for kind in PROCESSES})
            cores = " ".join(f"{kind} {busy[-1][kind]:.2f}" for kind in PROCESSES)
            print(f"live, {cells} cell(s): {rate:.0f} r/s -> {rows[-1][1]:.0f} r/s ({rows[-1][2]:.2%}); cores busy: "
                  f"{cores}", flush=True)  # fmt: skip
    finally:
        server.stop()
    return rows, busy


def simulated(cells: int, args: argparse.Namespace, busy: list[dict[str, float]] | None) -> list[Row]:
    """The simulator's goodput per rate: each process a core of its own (``busy`` None), or this machine's
    cores shared with the emulated workers and the load generator, as busy as they were live at that rate."""
    models = model_copies(builtin_profiles(), args.models)
    rows = []
    for index, rate in enumerate(args.rates):
        config = SimulationConfig(duration_ns=s_to_ns(args.seconds), warmup_ns=s_to_ns(args.warmup_s),
                                  devices=args.devices, seed=1, slo_ns=ms_to_ns(args.slo_ms))  # fmt: skip
        background = None if busy is None else busy[index]["workers"] + busy[index]["load generator"]
        machine = None if background is None else MachineShare(os.cpu_count() or 1, background)
        result = simulate("clockwork", models, PoissonOpenLoop(rate), config, cells=CellsConfig(cells, machine=machine))
        rows.append((rate, result.report.goodput_rps, result.report.slo_attainment))
        where = "a core each" if machine is None else f"{machine.cores:g} cores, {background:.2f} busy besides"
        print(f"simulated, {cells} cell(s), {where}: {rate:.0f} r/s -> {rows[-1][1]:.0f} r/s ({rows[-1][2]:.2%})",
              flush=True)  # fmt: skip
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
        runs = {cells: live(cells, args, Path(folder)) for cells in args.cells}
    measured = {cells: rows for cells, (rows, _) in runs.items()}
    predicted = {cells: simulated(cells, args, None) for cells in args.cells}
    on_this_machine = {cells: simulated(cells, args, runs[cells][1]) for cells in args.cells}
    print(f"\n{args.devices} emulated V100s, {args.models} models, SLO {args.slo_ms:g} ms, {args.seconds:g} s a rate")
    print("| cells | offered r/s | live goodput r/s (attainment) | cores busy live: " + ", ".join(PROCESSES)
          + " | simulated, a core each | simulated, this machine |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for cells in args.cells:
        rows = zip(measured[cells], runs[cells][1], predicted[cells], on_this_machine[cells], strict=True)
        for (rate, good, share), busy, (_, each, each_share), (_, here, here_share) in rows:
            cores = " + ".join(f"{busy[kind]:.2f}" for kind in PROCESSES) + f" = {sum(busy.values()):.2f}"
            print(f"| {cells} | {rate:.0f} | {good:.0f} ({share:.2%}) | {cores} | {each:.0f} ({each_share:.2%}) | "
                  f"{here:.0f} ({here_share:.2%}) |")  # fmt: skip
    print("\n| cells | live knee r/s (its goodput) | simulated, a core each | simulated, this machine | "
          "this machine / live |")  # fmt: skip
    print("|---|---|---|---|---|")
    for cells in args.cells:
        (rate, good, _), (each_rate, each, _) = knee(measured[cells]), knee(predicted[cells])
        here_rate, here, _ = knee(on_this_machine[cells])
        print(f"| {cells} | {rate:.0f} ({good:.0f}) | {each_rate:.0f} ({each:.0f}) | {here_rate:.0f} ({here:.0f}) | "
              f"{here / max(good, 1e-9):.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
