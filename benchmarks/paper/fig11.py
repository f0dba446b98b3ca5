"""Fig. 11: controller scalability. N emulated devices under the Azure load ramped from a load factor
of 0.1 to 2 (1.0: about what the devices can serve), 4,026 models.

Per N and policy: peak goodput (best 5 s window) and the policy's CPU seconds per simulated second
(above 1.0 one core could not keep up in real time).

With ``--on-the-clock`` (off under ``--quick``), a second table: clockwork with each controller's CPU
time on the simulated clock (``mainspring.cells.cost``), one controller against cells of at most 16
devices, at more devices: the knee of one controller, and the curve with cells.

    .venv/bin/python benchmarks/paper/fig11.py [--devices 8 16] [--duration-s 20] [--quick] [--on-the-clock 16 32 48 64]

The defaults are what ``make paper`` runs in reasonable time here: INFER4's cost grows with the
devices (1.5 ms of CPU per request at 16), so 40 devices for 60 s take hours. ``benchmarks/controller_cost.py``
measures clockwork alone up to 150 devices.
"""

from __future__ import annotations

import math

from common import markdown_table, parser, write_section

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.scheduler.registry import parse_policies
from mainspring.sim.cells import CellsConfig
from mainspring.sim.run import SimulationConfig, SimulationResult, generate_arrivals, simulate
from mainspring.time import NS_PER_S, s_to_ns
from mainspring.workload import AzureTrace

PER_DEVICE_SCALE = 25.0  # x100 keeps 6 devices ~67% busy at this mix: ~x25 per device fills one
CELL_DEVICES = 16


def peak_goodput(result: SimulationResult, window_s: int = 5) -> float:
    """Good requests per second in the best ``window_s`` window of arrivals."""
    window = window_s * NS_PER_S
    good: dict[int, int] = {}
    for row in result.recorder.requests:
        if row.good:
            good[row.arrival_ns // window] = good.get(row.arrival_ns // window, 0) + 1
    return max(good.values(), default=0) / window_s


def on_the_clock(devices: list[int], duration: float, max_factor: float) -> list[list[object]]:
    """Clockwork with its controllers' CPU on the clock: one controller, then cells of 16."""
    models = model_copies(builtin_profiles(), 4026)
    rows: list[list[object]] = []
    for n in devices:
        scale = PER_DEVICE_SCALE * n
        workload = AzureTrace(scale=0.1 * scale, start_minute=360, ramp_to=max_factor * scale)
        config = SimulationConfig(duration_ns=s_to_ns(duration), devices=n, seed=1)
        arrivals = generate_arrivals(workload, models, config)
        for cells in sorted({1, math.ceil(n / CELL_DEVICES)}):
            r = simulate("clockwork", models, workload, config, arrivals, cells=CellsConfig(cells))
            assert r.cells is not None
            busiest = max(c.busy for c in r.cells.cells)
            rows.append([n, cells, f"{r.report.offered_rps:.0f}", f"{peak_goodput(r):.0f}", f"{busiest:.0%}",
                         f"{r.report.refused_actions}"])  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--devices", type=int, nargs="+", default=[8, 16])
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--max-factor", type=float, default=2.0)
    p.add_argument("--on-the-clock", type=int, nargs="*", default=[16, 32, 48, 64])
    args = p.parse_args()
    policies = parse_policies(
        "clockwork,infer4,triton" if args.policy == "clockwork,infer4,triton,clipper" else args.policy
    )
    duration = 5.0 if args.quick else args.duration_s
    max_factor = 1.0 if args.quick else args.max_factor
    models = model_copies(builtin_profiles(), 4026)
    rows = []
    for n in [4] if args.quick else args.devices:
        scale = PER_DEVICE_SCALE * n
        workload = AzureTrace(scale=0.1 * scale, start_minute=360, ramp_to=max_factor * scale)
        config = SimulationConfig(duration_ns=s_to_ns(duration), devices=n, seed=1)
        arrivals = generate_arrivals(workload, models, config)
        for policy in policies:
            r = simulate(policy, models, workload, config, arrivals)
            peak = peak_goodput(r)
            cpu, per_request_us = r.report.policy_cpu_s_per_sim_s, r.report.policy_cpu_us_per_request
            rows.append(
                [n, policy, f"{r.report.offered_rps:.0f}", f"{peak:.0f}", f"{cpu:.2f}", f"{per_request_us:.0f}"]
            )
    write_section(
        "fig11",
        "Fig. 11: controller scalability (N devices, Azure load ramped)",
        f"The Azure sample from minute 360, scale ramped from {0.1 * PER_DEVICE_SCALE:g}N to "
        f"{max_factor * PER_DEVICE_SCALE:g}N over {duration:g} s, 4,026 models, N emulated V100s. Peak goodput: "
        "the best 5 s window; CPU: the policy's thread CPU seconds per simulated second on this machine (Python; "
        "Clockwork's C++ controller planned for 40 GPUs at 38.7k r/s on a 32-core machine, the paper's text).",
        markdown_table(
            ["devices", "policy", "offered r/s", "peak goodput r/s", "CPU s / sim s", "CPU us / request"], rows
        )
        + _clock_table(on_the_clock(args.on_the_clock, duration, max_factor) if not args.quick else []),
    )


def _clock_table(rows: list[list[object]]) -> str:
    if not rows:
        return ""
    return (
        "\n\nWith each controller's CPU time on the simulated clock (the cost model of `docs/simulator.md`), "
        f"clockwork in one cell and in cells of at most {CELL_DEVICES} devices, the same ramp. A controller core "
        "past its capacity plans late: its actions reach the devices after their windows (refused actions) and "
        "goodput falls; with a core per cell it grows with the devices.\n\n"
        + markdown_table(
            ["devices", "cells (cores)", "offered r/s", "peak goodput r/s", "busiest core", "refused actions"], rows
        )
    )


if __name__ == "__main__":
    main()
