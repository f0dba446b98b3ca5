"""Cells at scale, simulated with each controller's CPU time on the clock (``mainspring.cells.cost``).

Two parts, every figure measured in this run:

1. **The knee of one controller.** One cell (one controller core) over more and more devices, the
   load growing with them: goodput follows the offered load until the core saturates, then plans
   arrive late and goodput falls.
2. **Cells of at most 16 devices, from 8 to 1,000 devices.** The same load per device, split into
   ``ceil(devices / 16)`` cells. Prints goodput over offered, the controller cores used, each cell's
   modelled controller time per request (the spread over cells, and the ratio of the worst to the
   8-device run's), and the busiest core.

The load: three model copies per device (one of each of the built-in V100 profiles, uniform
popularity, Poisson), at ``--load`` (0.8) of what the devices serve at full batches of this mix;
100 ms SLO, ``--warmup-s`` served before counting (every model starts cold).

The cost charged is the live processes' by default (``LIVE_COST``: the policy, the controller process around
it and frontend cores, as many as keep each below 70% busy at the offered rate, so that the controllers are
what is measured); ``--controller-cost policy`` charges the policy alone, as before 2026-12-06.

    .venv/bin/python benchmarks/cells_scale.py [--devices 8 16 64 128 256 1000] [--knee 8 16 24 32 48 64]
        [--controller-cost live|policy]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence

from mainspring.cells.cost import CLOCKWORK_COST, LIVE_COST
from mainspring.cells.placement import CELL_DEVICES
from mainspring.models.profile import ModelProfile, builtin_profiles, model_copies
from mainspring.sim.cells import CellsConfig
from mainspring.sim.run import SimulationConfig, SimulationResult, simulate
from mainspring.time import NS_PER_S, s_to_ns
from mainspring.workload import PoissonOpenLoop


def device_capacity_rps(profiles: Sequence[ModelProfile]) -> float:
    """Requests a second one device serves of an even mix of ``profiles``, in full batches."""
    per_request_s = sum(min(ns / b for b, ns in p.exec_ns.items()) for p in profiles) / len(profiles) / NS_PER_S
    return 1 / per_request_s


def run(devices: int, cells: int, args: argparse.Namespace) -> tuple[SimulationResult, float]:
    base = builtin_profiles()
    models = model_copies(base, args.models_per_device * devices)
    rate = args.load * device_capacity_rps(base) * devices
    config = SimulationConfig(
        duration_ns=s_to_ns(args.duration_s), warmup_ns=s_to_ns(args.warmup_s), devices=devices, seed=args.seed
    )
    started = time.perf_counter()
    cost = LIVE_COST if args.controller_cost == "live" else CLOCKWORK_COST
    frontends = max(1, math.ceil(rate * cost.frontend.loaded(cost.frontend.request_ns) / NS_PER_S / 0.7))
    result = simulate("clockwork", models, PoissonOpenLoop(rate), config,
                      cells=CellsConfig(cells, cost, frontends=frontends))  # fmt: skip
    return result, time.perf_counter() - started


def knee(args: argparse.Namespace) -> None:
    print("1. One controller core, the load growing with the devices")
    print(f"{'devices':>7} {'offered r/s':>11} {'goodput/offered':>15} {'core busy':>9} {'us/request':>10}"
          f" {'late plans':>10} {'refused':>8}")  # fmt: skip
    for devices in args.knee:
        result, _ = run(devices, 1, args)
        report, cells = result.report, result.cells
        assert cells is not None
        cell = cells.cells[0]
        print(f"{devices:>7} {report.offered_rps:>11,.0f} {report.goodput_rps / report.offered_rps:>15.2%}"
              f" {cell.busy:>9.1%} {cell.cost_us_per_request:>10.1f} {report.refused_actions:>10,}"
              f" {cell.refused:>8,}", flush=True)  # fmt: skip


def scale(args: argparse.Namespace) -> None:
    print(f"\n2. Cells of at most {args.cell_devices} devices")
    print(f"{'devices':>7} {'cells=cores':>11} {'offered r/s':>11} {'goodput r/s':>11} {'goodput/offered':>15}"
          f" {'us/req min-max':>14} {'worst vs first':>14} {'busiest core':>12} {'frontends':>9}"
          f" {'wall s':>7}")  # fmt: skip
    first_worst: float | None = None
    for devices in args.devices:
        cells = math.ceil(devices / args.cell_devices)
        result, wall = run(devices, cells, args)
        report, summary = result.report, result.cells
        assert summary is not None
        costs = [c.cost_us_per_request for c in summary.cells]
        worst = max(costs)
        first_worst = worst if first_worst is None else first_worst
        print(f"{devices:>7} {summary.cores:>11} {report.offered_rps:>11,.0f} {report.goodput_rps:>11,.0f}"
              f" {report.goodput_rps / report.offered_rps:>15.2%} {min(costs):>6.1f}-{worst:<7.1f}"
              f" {worst / first_worst:>14.2f} {max(c.busy for c in summary.cells):>12.1%}"
              f" {len(summary.frontends):>9} {wall:>7.0f}",
              flush=True)  # fmt: skip
    print("aims: goodput/offered >= 95% on every row; worst vs first <= 1.3; a row of at most 8 cores above 40,000 r/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 16, 64, 128, 256, 1000])
    parser.add_argument("--knee", type=int, nargs="*", default=[8, 16, 24, 32, 48, 64])
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--models-per-device", type=int, default=3)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--duration-s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cell-devices", type=int, default=CELL_DEVICES, help="the most devices a cell has")
    parser.add_argument("--controller-cost", choices=("live", "policy"), default="live",
                        help="the live processes as fitted (default), or the policy's calls alone")  # fmt: skip
    args = parser.parse_args()
    if args.knee:
        knee(args)
    if args.devices:
        scale(args)


if __name__ == "__main__":
    main()
