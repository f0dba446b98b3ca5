"""Fig. 5: how low can the SLO go. 15 resnet50_v2 copies on one device, 16 closed-loop clients each.

Goodput per SLO (10 to 500 ms) per policy, and as a share of the device's batch-16
throughput limit (16 / 21.73 ms = 736 r/s). Aim: clockwork >= 90% of the limit at SLO >= 100 ms.

    .venv/bin/python benchmarks/paper/fig5.py [--duration-s 20] [--quick]
"""

from __future__ import annotations

from common import markdown_table, parser, resnet50_copies, side_by_side, write_section

from mainspring.scheduler.registry import parse_policies
from mainspring.sim.run import SimulationConfig
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import ClosedLoop

SLOS_MS = (10, 25, 50, 100, 250, 500)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--duration-s", type=float, default=20.0)
    args = p.parse_args()
    policies = parse_policies(args.policy)
    models = resnet50_copies(15)
    limit = 16 / (models[0].exec_ns[16] / 1e9)
    rows = []
    for slo_ms in SLOS_MS[2:4] if args.quick else SLOS_MS:
        duration = 2.0 if args.quick else args.duration_s
        config = SimulationConfig(duration_ns=s_to_ns(duration), devices=1, slo_ns=ms_to_ns(slo_ms), seed=1)
        results = side_by_side(policies, models, ClosedLoop(240), config)
        cells = [f"{r.report.goodput_rps:.0f} ({r.report.goodput_rps / limit:.1%})" for r in results.values()]
        rows.append([f"{slo_ms} ms", *cells])
    write_section(
        "fig5",
        "Fig. 5: goodput against the SLO (one device, 15 models, 240 closed-loop clients)",
        f"15 copies of resnet50_v2 on one emulated V100, 16 closed-loop clients per model (a client waits 10 ms "
        f"after a rejection), {args.duration_s:g} s per point. Goodput in r/s (share of the batch-16 limit, "
        f"{limit:.0f} r/s). The paper plots this figure (Clockwork against Clipper and INFaaS) without a table.",
        markdown_table(["SLO", *policies], rows),
    )


if __name__ == "__main__":
    main()
