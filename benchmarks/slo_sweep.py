"""SLO sweep (Clockwork's Fig. 7): goodput per SLO per policy, 12 and 48 model copies on one device.

The SLO is a factor of resnet50_v2's batch-1 time (3.32 ms), from 1x to 100x.
Each point is its own run on the identical Poisson arrival sequence for every
policy. Aim: clockwork's goodput at least the best baseline's at every SLO, far
above it at tight SLOs.

    .venv/bin/python benchmarks/slo_sweep.py [--rate 600] [--duration-s 10]
"""

from __future__ import annotations

import argparse

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.scheduler.registry import parse_policies
from mainspring.sim.run import SimulationConfig, generate_arrivals, simulate
from mainspring.time import s_to_ns
from mainspring.workload import PoissonOpenLoop

FACTORS = (1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 50.0, 100.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=600.0, help="offered requests/s over all models")
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--models", type=int, nargs="+", default=[12, 48])
    parser.add_argument("--policy", default="clockwork,triton,clipper")
    args = parser.parse_args()
    policies = parse_policies(args.policy)
    resnet50 = [p for p in builtin_profiles() if p.model == "resnet50_v2"]
    batch1_ns = resnet50[0].exec_ns[1]
    for n_models in args.models:
        models = model_copies(resnet50, n_models)
        print(f"{n_models} copies of resnet50_v2 on 1 device, {args.rate:g} r/s Poisson: goodput (r/s) per SLO")
        print(f"{'SLO':>12} " + " ".join(f"{p:>10}" for p in policies) + "   clockwork / best baseline")
        for factor in FACTORS:
            config = SimulationConfig(
                duration_ns=s_to_ns(args.duration_s), devices=1, slo_ns=round(factor * batch1_ns), seed=7
            )
            workload = PoissonOpenLoop(args.rate)
            arrivals = generate_arrivals(workload, models, config)
            goodput = {p: simulate(p, models, workload, config, arrivals).report.goodput_rps for p in policies}
            best_baseline = max((g for p, g in goodput.items() if p != "clockwork"), default=None)
            if best_baseline is None or "clockwork" not in goodput:
                ratio = ""
            elif best_baseline > 0:
                ratio = f"{goodput['clockwork'] / best_baseline:>8.2f}"
            else:
                ratio = "  (baselines: none)"
            label = f"{factor:g}x {factor * batch1_ns / 1e6:.1f}ms"
            print(f"{label:>12} " + " ".join(f"{goodput[p]:>10.1f}" for p in policies) + f"   {ratio}")
        print()


if __name__ == "__main__":
    main()
