"""Controller cost: scheduler CPU time per request, and how many emulated devices one core keeps saturated.

The load ramps with the number of devices (as in Clockwork's Fig. 11): N devices,
50 model copies each, Poisson arrivals at --rate-per-device. The policy's CPU time
is measured around every call (on_request, on_result, schedule) in the simulator
(``policy_cpu_us_per_request`` of every simulation report), so it excludes the
emulation. One core keeps N devices saturated in real time while the policy needs
less than one CPU second per simulated second.

    .venv/bin/python benchmarks/controller_cost.py [--devices 1 2 4 8 16 32 64] [--policy clockwork]
"""

from __future__ import annotations

import argparse

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.scheduler.registry import parse_policies
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import s_to_ns
from mainspring.workload import PoissonOpenLoop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--rate-per-device", type=float, default=250.0)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--policy", default="clockwork,triton")
    args = parser.parse_args()
    print(
        f"{'policy':>10} {'devices':>7} {'offered r/s':>11} {'goodput r/s':>11} {'busy':>5} {'policy us/req':>13}"
        f" {'policy r/s per core':>19} {'policy cpu s per sim s':>22}"
    )
    for policy in parse_policies(args.policy):
        saturated = 0
        for n in args.devices:
            models = model_copies(builtin_profiles(), 50 * n)
            config = SimulationConfig(duration_ns=s_to_ns(args.duration_s), devices=n, seed=3)
            report = simulate(policy, models, PoissonOpenLoop(args.rate_per_device * n), config).report
            per_sim_s = report.policy_cpu_s_per_sim_s
            cpu_s = per_sim_s * report.simulated_s
            if per_sim_s < 1.0:
                saturated = n
            print(
                f"{policy:>10} {n:>7} {report.offered_rps:>11.0f} {report.goodput_rps:>11.0f}"
                f" {report.device_busy:>5.0%} {1e6 * cpu_s / report.requests:>13.1f}"
                f" {report.requests / cpu_s:>19.0f} {per_sim_s:>22.3f}"
            )
        print(f"{policy}: one core keeps up in real time with up to {saturated} devices of those tried\n")


if __name__ == "__main__":
    main()
