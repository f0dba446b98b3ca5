"""Fig. 5: how low can the SLO go. 15 resnet50_v2 copies on one device, 16 closed-loop clients each.

Goodput per SLO (10 to 500 ms) per policy, and as a share of the device's batch-16
throughput limit (16 / 21.73 ms = 736 r/s). Aim: clockwork >= 90% of the limit at SLO >= 100 ms.

    .venv/bin/python benchmarks/paper/fig5.py [--duration-s 20] [--quick]
"""

from __future__ import annotations

import numpy as np
from common import (
    markdown_table,
    parser,
    policies_from,
    pyplot,
    resnet50_copies,
    save_plot,
    side_by_side,
    write_section,
)

from mainspring.sim.run import SimulationConfig, SimulationResult
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import ClosedLoop

SLOS_MS = (10, 25, 50, 100, 250, 500)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--duration-s", type=float, default=20.0)
    args = p.parse_args()
    policies = policies_from(args.policy)
    models = resnet50_copies(15)
    limit = 16 / (models[0].exec_ns[16] / 1e9)
    rows = []
    by_slo = {}
    for slo_ms in SLOS_MS[2:4] if args.quick else SLOS_MS:
        duration = 2.0 if args.quick else args.duration_s
        config = SimulationConfig(duration_ns=s_to_ns(duration), devices=1, slo_ns=ms_to_ns(slo_ms), seed=1)
        results = by_slo[slo_ms] = side_by_side(policies, models, ClosedLoop(240), config)
        cells = [f"{r.report.goodput_rps:.0f} ({r.report.goodput_rps / limit:.1%})" for r in results.values()]
        rows.append([f"{slo_ms} ms", *cells])
    ceiling = 8 / (models[0].exec_ns[8] / 1e9) / limit  # INFER5 batches at most 8
    write_section(
        "fig5",
        "Fig. 5: goodput against the SLO (one device, 15 models, 240 closed-loop clients)",
        f"**The authors'** (`sec61_fig5`): 15 resnet50_v2 copies on one V100, a closed loop of 16 per model, "
        "the controller's SLO 10, 25, 50, 100, 250 and 500 ms, 30 minutes each, INFER5 (batches of at most 8), "
        "against Clipper and INFaaS. **Ours:** the same models and clients on one emulated V100, "
        f"{args.duration_s:g} s per point; goodput in r/s (share of the batch-16 limit, {limit:.0f} r/s). "
        "**Differences:** 20 s per point against 30 minutes; our baselines are re-implementations, not Clipper "
        "and INFaaS; the README's command passes 250000000 where the controller reads its schedule-ahead, so "
        "what the authors ran is unclear, and `infer5` here keeps its default 10 ms. **Headline:** the paper "
        'plots goodput and latency per SLO without a table (section 6.1, "How does Clockwork compare?"). '
        f"**Where the port falls short:** INFER5 batches at most 8, so it cannot pass {ceiling:.0%} of the "
        "batch-16 limit. Latency CDFs per SLO: `out/paper/fig5.png`.",
        markdown_table(["SLO", *policies], rows),
    )
    plot(by_slo)


def plot(by_slo: dict[int, dict[str, SimulationResult]]) -> None:
    """Per SLO, the latency CDF of the requests each policy served (``out/paper/fig5.png``), as the
    paper's Fig. 5 does; the dotted line is the SLO, so the curve's height there is the share served in time."""
    plt = pyplot()
    cols = min(3, len(by_slo))
    rows = -(-len(by_slo) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), sharey=True, squeeze=False)
    for axis, (slo_ms, results) in zip(axes.flat, by_slo.items(), strict=False):
        for policy, result in results.items():
            served = np.sort([row.latency_ns / 1e6 for row in result.recorder.requests if row.status == "success"])
            if served.size:
                axis.plot(served, np.arange(1, served.size + 1) / served.size, label=policy)
        axis.axvline(slo_ms, linestyle=":", color="grey")
        axis.set_xscale("log")
        axis.set_title(f"SLO {slo_ms} ms")
        axis.set_xlabel("latency of served requests (ms)")
    for row in axes:
        row[0].set_ylabel("CDF")
    axes[0][0].legend(fontsize=6)
    save_plot(fig, "fig5")


if __name__ == "__main__":
    main()
