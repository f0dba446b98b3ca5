"""What partitioning costs: the Azure replay on windows across the day, one controller against 2 and 3
cells, each controller's CPU time on the clock.

The setting of ``benchmarks/paper/azure_windows.py`` (4,026 models, 6 emulated V100s, 100 ms SLO,
each window at the scale that offers ``--target-rps`` on average, counted after a minute of
warm-up), run with the clockwork policy behind cells (``mainspring.sim.cells``). Every
configuration of a (window, seed) replays the identical arrivals. Prints misses per million
(requests not answered successfully within the SLO) for one free controller (the simulator's
default), one controller with its cost on the clock, and each cell count, then the worst ratio of a
cell layout's misses to one controller's (a zero counts as one miss).

    .venv/bin/python benchmarks/cells_azure.py [--minutes 180 ...] [--seeds 1 2 3] [--cells 2 3] [--duration-s 600]
"""

from __future__ import annotations

import argparse
import sys
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from mainspring.cells.cost import CLOCKWORK_COST
from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.sim.cells import CellsConfig
from mainspring.sim.run import SimulationConfig, generate_arrivals, simulate
from mainspring.time import s_to_ns
from mainspring.workload import AzureTrace

sys.path.insert(0, str(Path(__file__).parent / "paper"))
from azure_windows import MINUTES, window_scale


def run_window(task: tuple[int, int, float, float, tuple[int, ...]]) -> dict[str, Any]:
    minute, seed, duration_s, target_rps, layouts = task
    models = model_copies(builtin_profiles(), 4026)
    config = SimulationConfig(duration_ns=s_to_ns(duration_s), devices=6, seed=seed, warmup_ns=s_to_ns(60))
    scale = window_scale(minute, duration_s, target_rps)
    workload = AzureTrace(scale=scale, start_minute=minute - 1)
    arrivals = generate_arrivals(workload, models, config)
    row: dict[str, Any] = {"minute": minute, "seed": seed, "scale": scale}
    for name, cells in [("free", None), *((f"{n} cell(s)", CellsConfig(n, CLOCKWORK_COST)) for n in layouts)]:
        report = simulate("clockwork", models, workload, config, arrivals, cells=cells).report
        row["requests"] = report.requests
        row[name] = report.requests - round(report.slo_attainment * report.requests)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, nargs="+", default=list(MINUTES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--cells", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--duration-s", type=float, default=600)
    parser.add_argument("--target-rps", type=float, default=680.0)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    layouts = (1, *args.cells)
    names = ["free", *(f"{n} cell(s)" for n in layouts)]
    tasks = [(m, s, args.duration_s, args.target_rps, layouts) for m in args.minutes for s in args.seeds]
    print(f"{'minute':>6} {'seed':>4} {'scale':>6} {'requests':>9} " + " ".join(f"{n:>10}" for n in names))
    worst = 0.0
    lowest = 1.0
    with Pool(args.jobs) as pool:
        for row in pool.imap(run_window, tasks):
            per_million = [1e6 * row[n] / row["requests"] for n in names]
            print(f"{row['minute']:>6} {row['seed']:>4} {row['scale']:>6g} {row['requests']:>9} "
                  + " ".join(f"{v:>10.1f}" for v in per_million), flush=True)  # fmt: skip
            one = max(row["1 cell(s)"], 1)
            worst = max(worst, *(max(row[f"{n} cell(s)"], 1) / one for n in args.cells))
            lowest = min(lowest, *(1 - row[n] / row["requests"] for n in names[1:]))
    print("misses per million requests; free: one controller that costs no time")
    print(f"lowest attainment of a run with its controllers on the clock: {lowest:.4%} (aim: at least 99.99%)")
    print(f"most misses of a cell layout over one controller's: {worst:.2f}x (aim: at most 2x; a zero counts as one)")


if __name__ == "__main__":
    main()
