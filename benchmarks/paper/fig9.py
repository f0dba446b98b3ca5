"""Figs. 9 and 10: the Azure Functions replay (4,026 models, 6 devices, 100 ms SLO), with the error of
every prediction: duration (actual minus expected) and completion (actual end minus planned end).

    .venv/bin/python benchmarks/paper/fig9.py [--duration-s 600] [--minute 360] [--scale 100] [--quick]
"""

from __future__ import annotations

import numpy as np
from common import OUT, markdown_table, parser, side_by_side, write_section

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.scheduler.registry import parse_policies
from mainspring.sim.run import SimulationConfig, SimulationResult
from mainspring.time import s_to_ns
from mainspring.workload import AzureTrace

QUANTILES = (50, 99, 99.9, 100)


def errors_ms(result: SimulationResult, kind: str, completion: bool) -> np.ndarray:
    """Duration error, or completion error against the planned end (``earliest`` is the planned start)."""
    values = [
        (a.end_ns - (a.earliest_ns + a.expected_ns)) if completion else (a.end_ns - a.begin_ns - a.expected_ns)
        for a in result.recorder.actions
        if a.status == "ok" and a.kind == kind
    ]
    return np.asarray(values, dtype=np.float64) / 1e6


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--minute", type=int, default=360)
    p.add_argument("--scale", type=float, default=100.0)
    args = p.parse_args()
    policies = parse_policies(args.policy)
    duration = 30.0 if args.quick else args.duration_s
    models = model_copies(builtin_profiles(), 4026)
    config = SimulationConfig(duration_ns=s_to_ns(duration), devices=6, seed=1)
    workload = AzureTrace(scale=args.scale, start_minute=args.minute)
    results = side_by_side(policies, models, workload, config)
    rows = []
    for policy, r in results.items():
        rep = r.report
        misses = rep.requests - round(rep.slo_attainment * rep.requests)
        rows.append(
            [
                policy,
                rep.requests,
                f"{rep.slo_attainment:.5%}",
                misses,
                rep.late,
                f"{rep.latency_ms['p99']:.1f} / {rep.latency_ms['max']:.1f}",
                f"{rep.device_busy:.1%}",
            ]
        )
    error_rows = []
    for policy in [q for q in ("clockwork", "infer4") if q in results]:
        for kind in ("infer", "load"):
            for completion in (False, True):
                if completion and policy != "clockwork":
                    continue  # infer4 sends earliest = now: it states no planned start
                values = errors_ms(results[policy], kind, completion)
                if values.size:
                    cells = [f"{np.percentile(values, q):+.3f}" for q in QUANTILES]
                    error_rows.append([policy, kind, "completion" if completion else "duration", *cells])
    plot(results)
    write_section(
        "fig9",
        "Figs. 9 and 10: Azure replay, attainment and prediction error",
        f"The bundled Azure Functions sample from minute {args.minute} at x{args.scale:g}, 4,026 models "
        f"(61 kinds x 66 in the paper; here 3 profiled kinds, copies), 6 emulated V100s, 100 ms SLO, "
        f"{duration:g} s, default noise. The paper reports 99.997% of requests within 100 ms on its replay "
        "(abstract, arXiv v1); its Fig. 10 plots the errors as CDFs.",
        markdown_table(["policy", "requests", "attainment", "misses", "late", "p99 / max ms", "busy"], rows)
        + "\n\nError of every prediction, ms (actual minus predicted; percentiles p50, p99, p99.9, max):\n\n"
        + markdown_table(["policy", "action", "error", "p50", "p99", "p99.9", "max"], error_rows),
    )


def plot(results: dict[str, SimulationResult]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for policy in [q for q in ("clockwork", "infer4") if q in results]:
        for ax, kind in zip(axes, ("infer", "load"), strict=True):
            values = np.sort(errors_ms(results[policy], kind, completion=False))
            if values.size:
                ax.plot(values, np.arange(1, values.size + 1) / values.size, label=f"{policy} duration")
            if policy == "clockwork":
                done = np.sort(errors_ms(results[policy], kind, completion=True))
                if done.size:
                    ax.plot(done, np.arange(1, done.size + 1) / done.size, label=f"{policy} completion")
            ax.set_title(kind)
            ax.set_xlabel("actual - predicted (ms)")
    axes[0].set_ylabel("CDF")
    axes[0].legend(fontsize=7)
    OUT.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(OUT / "fig10.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
