"""Azure Functions replay: 4,026 models on 6 emulated V100s, 100 ms SLO, policies side by side.

Every policy replays the identical arrival sequence. Aim: SLO attainment of at
least 99.99% for clockwork with the default noise model, clearly above both
baselines.

    .venv/bin/python benchmarks/azure_replay.py [--duration-s 600] [--trace-scale 50 70 100]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.scheduler.registry import parse_policies
from mainspring.sim.run import SimulationConfig, generate_arrivals, simulate
from mainspring.telemetry.report import format_table
from mainspring.time import s_to_ns
from mainspring.workload import AzureTrace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=600)
    parser.add_argument("--trace-scale", type=float, nargs="+", default=[50.0, 70.0, 100.0])
    parser.add_argument("--trace-start-minute", type=int, default=0)
    parser.add_argument("--policy", default="clockwork,triton,clipper")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    models = model_copies(builtin_profiles(), 4026)
    config = SimulationConfig(duration_ns=s_to_ns(args.duration_s), devices=6, seed=args.seed)
    everything = []
    for scale in args.trace_scale:
        workload = AzureTrace(scale=scale, start_minute=args.trace_start_minute)
        arrivals = generate_arrivals(workload, models, config)
        reports = [simulate(p, models, workload, config, arrivals).report for p in parse_policies(args.policy)]
        print(format_table(reports))
        by_policy = {r.policy: r for r in reports}
        if "clockwork" in by_policy and len(reports) > 1:
            best = max((r for r in reports if r.policy != "clockwork"), key=lambda r: r.slo_attainment)
            cw = by_policy["clockwork"]
            miss_ratio = (1 - best.slo_attainment) / max(1 - cw.slo_attainment, 1 / max(cw.requests, 1))
            cw_misses = round((1 - cw.slo_attainment) * cw.requests)
            best_misses = round((1 - best.slo_attainment) * best.requests)
            print(
                f"scale {scale:g}: clockwork misses the SLO for {cw_misses} of {cw.requests} requests "
                f"({1 - cw.slo_attainment:.4%}), best baseline ({best.policy}) for {best_misses} "
                f"({1 - best.slo_attainment:.4%}): {miss_ratio:.0f}x fewer misses "
                f"(a zero counts as one); goodput ratio {cw.goodput_rps / max(best.goodput_rps, 1e-9):.3f}"
            )
        print()
        everything += [dict(r.to_json(), trace_scale=scale) for r in reports]
    if args.json is not None:
        args.json.write_text(json.dumps({"results": everything}, indent=2) + "\n")


if __name__ == "__main__":
    main()
