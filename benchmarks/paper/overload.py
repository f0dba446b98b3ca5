"""Past saturation: goodput against offered open-loop load (Poisson, uniform over N resnet50_v2 copies, one device).

Offered load is a multiple of the device's batch-16 limit (16 / 21.73 ms = 736 r/s). Goodput is shown
as a share of that limit and, per policy, of the policy's own peak over the sweep: a policy whose goodput
holds past saturation keeps 1.5x and 3x near its peak. With 15 models at 1.5x each model gets 74 r/s,
about 6 requests per 100 ms SLO, so batches of 16 cannot form; the limit is out of reach at that load
for any policy.

    .venv/bin/python benchmarks/paper/overload.py [--duration-s 10] [--seeds 1 2 3] [--quick]
"""

from __future__ import annotations

from common import markdown_table, parser, resnet50_copies, side_by_side, write_section

from mainspring.scheduler.registry import parse_policies
from mainspring.sim.run import SimulationConfig
from mainspring.time import s_to_ns
from mainspring.workload import PoissonOpenLoop

LOADS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
MODEL_COUNTS = (15, 3)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--models", type=int, nargs="+", default=list(MODEL_COUNTS))
    args = p.parse_args()
    policies = parse_policies(args.policy)
    duration = 2.0 if args.quick else args.duration_s
    seeds = args.seeds[:1] if args.quick else args.seeds
    loads = (1.0, 3.0) if args.quick else LOADS
    sections = []
    for count in args.models:
        models = resnet50_copies(count)
        limit = 16 / (models[0].exec_ns[16] / 1e9)
        goodput: dict[tuple[float, str], float] = {}
        for load in loads:
            for seed in seeds:
                config = SimulationConfig(duration_ns=s_to_ns(duration), devices=1, seed=seed)
                for policy, result in side_by_side(policies, models, PoissonOpenLoop(load * limit), config).items():
                    goodput[load, policy] = goodput.get((load, policy), 0.0) + result.report.goodput_rps / len(seeds)
            print(count, load, {pol: round(goodput[load, pol]) for pol in policies}, flush=True)
        peak = {policy: max(goodput[load, policy] for load in loads) for policy in policies}
        rows = [
            [
                f"{load:g}x",
                *(f"{goodput[load, pol] / limit:.1%} ({goodput[load, pol] / peak[pol]:.0%})" for pol in policies),
            ]
            for load in loads
        ]
        sections.append(f"**{count} models**\n\n" + markdown_table(["offered", *policies], rows))
    write_section(
        "overload",
        "Past saturation: goodput against offered open-loop load",
        f"Poisson arrivals spread uniformly over N resnet50_v2 copies on one emulated V100, 100 ms SLO, "
        f"{duration:g} s per point, mean of seeds {', '.join(map(str, seeds))}. Offered load as a multiple of the "
        f"batch-16 limit (736 r/s). Cells: goodput as a share of that limit (as a share of the policy's own peak). "
        f"With 15 models at 1.5x each model gets 74 r/s, about 7 requests per 100 ms SLO, so batches of 16 cannot "
        f"form at that load for any policy (16 requests of one model take 217 ms to arrive); full batches of 8 would "
        f"give 87% of the limit.",
        "\n\n".join(sections),
    )


if __name__ == "__main__":
    main()
