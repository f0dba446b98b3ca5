"""Simulator speed: simulated seconds per wall second and events per second.

4,026 models (copies of the built-in profiles) on 6 emulated devices replaying
the bundled Azure Functions sample. Aim: at least 20x faster than real time on
one core, so a 10-minute replay takes under 30 s.

    .venv/bin/python benchmarks/sim_speed.py [--duration-s 600] [--trace-scale 1] [--policy triton]
"""

from __future__ import annotations

import argparse
import time

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.scheduler.registry import DEFAULT_POLICY, parse_policies
from mainspring.sim.run import SimulationConfig, generate_arrivals, simulate
from mainspring.time import s_to_ns
from mainspring.workload import AzureTrace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=600)
    parser.add_argument("--trace-scale", type=float, nargs="+", default=[1.0, 10.0, 100.0])
    parser.add_argument("--policy", default=DEFAULT_POLICY)
    args = parser.parse_args()
    models = model_copies(builtin_profiles(), 4026)
    config = SimulationConfig(duration_ns=s_to_ns(args.duration_s), devices=6)
    columns = ("policy", "scale", "requests", "events", "wall s", "sim s/wall s", "events/s")
    print(" ".join(f"{c:>{w}}" for c, w in zip(columns, (10, 6, 9, 9, 7, 13, 9), strict=True)))
    for scale in args.trace_scale:
        workload = AzureTrace(scale=scale)
        started = time.perf_counter()
        arrivals = generate_arrivals(workload, models, config)
        generate_s = time.perf_counter() - started
        for policy in parse_policies(args.policy):
            result = simulate(policy, models, workload, config, arrivals)
            r = result.report
            speed = r.simulated_s / r.wall_s
            print(
                f"{policy:>10} {scale:>6g} {r.requests:>9} {r.events:>9} {r.wall_s:>7.2f} {speed:>12.0f}x"
                f" {r.events / r.wall_s:>9.0f}   (arrivals generated in {generate_s:.2f} s)"
            )


if __name__ == "__main__":
    main()
