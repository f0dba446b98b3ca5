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
from mainspring.telemetry.recorder import ActionRow
from mainspring.time import s_to_ns
from mainspring.workload import AzureTrace

QUANTILES = (50, 99, 99.9, 100)


def errors_ms(result: SimulationResult, kind: str, completion: bool) -> np.ndarray:
    """Duration error (actual minus expected), or completion error (actual end minus planned end)."""
    rows = [a for a in result.recorder.actions if a.kind == kind]
    if completion:
        planned = planned_ends(rows)
        values = [a.end_ns - planned[a.action_id] for a in rows if a.status == "ok"]
    else:
        values = [a.end_ns - a.begin_ns - a.expected_ns for a in rows if a.status == "ok"]
    return np.asarray(values, dtype=np.float64) / 1e6


def planned_ends(rows: list[ActionRow]) -> dict[int, int]:
    """The end the controller planned for each action when it sent it: from when its lane would be free
    by what the controller knew then (the previous action's reported end once reported, else its
    planned end), or its earliest start if later, plus the estimate. (The earliest start alone is
    not the planned start: actions may start as soon as the lane frees, ``start_early``.)"""
    planned: dict[int, int] = {}
    by_device: dict[int, list[ActionRow]] = {}
    for row in rows:
        by_device.setdefault(row.device, []).append(row)
    for lane in by_device.values():
        lane.sort(key=lambda r: (r.sent_ns, r.action_id))
        previous: ActionRow | None = None
        for row in lane:
            free = 0
            if previous is not None:
                if previous.received_ns > row.sent_ns:
                    free = planned[previous.action_id]
                else:  # reported: its end, or when it was refused
                    free = previous.end_ns if previous.end_ns >= 0 else previous.received_ns
            planned[row.action_id] = max(row.earliest_ns, free) + row.expected_ns
            previous = row
    return planned


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
