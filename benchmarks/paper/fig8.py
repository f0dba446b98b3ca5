"""Fig. 8: can the latency-sensitive be isolated from batch clients? 6 devices; 6 latency-sensitive
models at 200 r/s each under an SLO that grows from 2x their batch-1 time, beside background
closed-loop batch clients (none, 12 clients x 16 outstanding, 48 x 4) with a relaxed SLO.

Attainment of each class per policy. Aim: the latency-sensitive class unaffected by the batch load.

    .venv/bin/python benchmarks/paper/fig8.py [--duration-s 60] [--quick]
"""

from __future__ import annotations

from common import markdown_table, parser, resnet50_copies, side_by_side, write_section

from mainspring.scheduler.registry import parse_policies
from mainspring.sim.run import SimulationConfig
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import ClosedLoop, Composition, FixedRate, Part, SloSweep

BATCH_SLO_MS = 1000.0


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--duration-s", type=float, default=60.0)
    args = p.parse_args()
    policies = parse_policies(args.policy)
    duration = 5.0 if args.quick else args.duration_s
    models = resnet50_copies(6 + 48)
    names = tuple(m.model for m in models)
    latency_models, batch_models = names[:6], names[6:]
    rows = []
    for clients, outstanding in [(0, 0), (12, 16), (48, 4)]:
        parts = [
            Part(
                "latency",
                SloSweep(FixedRate(200), start_factor=2.0, growth=1.5, interval_s=duration / 10, max_factor=100),
                latency_models,
            )
        ]
        if clients:
            own = batch_models[:clients]
            parts.append(Part("batch", ClosedLoop(clients, outstanding), own, slo_ns=ms_to_ns(BATCH_SLO_MS)))
        config = SimulationConfig(duration_ns=s_to_ns(duration), devices=6, seed=1)
        results = side_by_side(policies, models, Composition(parts), config)
        for policy, r in results.items():
            by_label = r.report.by_label
            batch = by_label.get("batch")
            rows.append(
                [
                    f"{clients} x {outstanding}" if clients else "none",
                    policy,
                    f"{by_label['latency']['slo_attainment']:.3%}",
                    f"{by_label['latency']['goodput_rps']:.0f}",
                    "-" if batch is None else f"{batch['slo_attainment']:.2%}",
                    "-" if batch is None else f"{batch['goodput_rps']:.0f}",
                ]
            )
    write_section(
        "fig8",
        "Fig. 8: isolation of latency-sensitive models from batch clients (6 devices)",
        f"6 latency-sensitive resnet50_v2 copies at a fixed 200 r/s each, SLO growing from 2x the batch-1 time "
        f"(6.6 ms) by x1.5 every {duration / 10:g} s; batch clients on their own copies with a {BATCH_SLO_MS:g} ms "
        f"SLO; {duration:g} s. The paper plots this figure without a table.",
        markdown_table(
            ["batch clients", "policy", "latency attainment", "latency goodput", "batch attainment", "batch goodput"],
            rows,
        ),
    )


if __name__ == "__main__":
    main()
