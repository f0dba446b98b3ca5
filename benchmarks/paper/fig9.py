"""Figs. 9 and 10: the Azure Functions replay (4,026 models, 6 devices, 100 ms SLO), with the error of
every prediction: duration (actual minus expected) and completion (actual end minus planned end).

    .venv/bin/python benchmarks/paper/fig9.py [--duration-s 600] [--minute 360] [--scale 100] [--quick]
"""

from __future__ import annotations

import numpy as np
from common import markdown_table, parser, policies_from, pyplot, save_plot, side_by_side, write_section

from mainspring.models.profile import builtin_profiles, model_copies
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
    p = parser(__doc__, POLICIES)
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--minute", type=int, default=360)
    p.add_argument("--scale", type=float, default=100.0)
    p.add_argument("--authors-mapping", action="store_true",
                   help="map functions to models as the authors did (one model a function; with the 900-function "
                        "sample, 900 of the 4,026 models get traffic)")  # fmt: skip
    args = p.parse_args()
    policies = policies_from(args.policy)
    duration = 30.0 if args.quick else args.duration_s
    models = model_copies(builtin_profiles(), 4026)
    config = SimulationConfig(duration_ns=s_to_ns(duration), devices=6, seed=1)
    workload = AzureTrace(scale=args.scale, start_minute=args.minute, authors_mapping=args.authors_mapping)
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
    plot_over_time(results, bucket_s=max(1.0, duration / 60))
    write_section(
        "fig9",
        "Figs. 9 and 10: Azure replay, attainment and prediction error",
        "**The authors'** (`sec65_fig9_fig10`): the Azure Functions trace, day 1, every function, from minute 0 "
        "at its real rate, for 8 hours (2 enough), 61 model kinds x 66 = 4,026 models on 6 V100s, 100 ms SLO, "
        "INFER4 (schedule-ahead 10 ms, batches of at most 16), inputs generated by the controller. **Ours:** "
        f"the bundled 900-function sample (`docs/workloads.md`) from minute {args.minute} at x{args.scale:g}, "
        "4,026 models (3 profiled kinds, copies), 6 emulated V100s, 100 ms SLO, "
        f"{duration:g} s from cold, default noise. **Differences:** a sample at x{args.scale:g} against the "
        "whole trace at x1; minutes against hours, the start counted; 3 kinds against 61; no inputs sent. "
        '**Headline:** "meeting 100 ms latency targets for 99.9999% of requests" (arXiv v2; the OSDI proceedings '
        "and arXiv v1 say 99.997%: see the top of this page). **Functions to models:** the authors sort the "
        "trace's functions by invocations and give each model a contiguous block of them, so many functions "
        "share a model; here each of the sampled functions is split over 4-5 models, the inverse "
        "(`--authors-mapping` maps them as the authors did). The load "
        "is about half of what the devices serve (the busy column). **Fig. 10 is circular here:** the "
        "emulator's durations are the profile's times with noise, and the estimates start from the same "
        "profile, so the errors below measure the emulator's noise model, not a GPU; the real figure needs "
        "one (`make gpu-check` prints it). Fig. 10 plots the prediction errors as CDFs. "
        "**Where the port falls short:** INFER4, the "
        "scheduler the authors ran here, misses more than one in a million on this window (the table: misses "
        "over requests); the paper's figure is for its own trace and hardware. Time series (goodput, latency, "
        "batch size, cold starts, models loaded, per 10 s): `out/paper/fig9.png`; error CDFs: `fig10.png`.",
        markdown_table(["policy", "requests", "attainment", "misses", "late", "p99 / max ms", "busy"], rows)
        + "\n\nError of every prediction, ms (actual minus predicted; percentiles p50, p99, p99.9, max):\n\n"
        + markdown_table(["policy", "action", "error", "p50", "p99", "p99.9", "max"], error_rows),
    )


POLICIES = ("clockwork", "infer4", "infer5", "triton", "clipper")  # the authors ran INFER4 for Figs. 9-10


def over_time(result: SimulationResult, bucket_s: float) -> dict[str, list[float]]:
    """Per bucket of ``bucket_s``: goodput (r/s), served latency p50 / p99 / max (ms), mean batch size,
    cold starts (loads a second), and the distinct models loaded, as the paper's Fig. 9."""
    bucket = s_to_ns(bucket_s)
    n = 1 + max((row.arrival_ns for row in result.recorder.requests), default=0) // bucket
    good = [0] * n
    latencies: list[list[float]] = [[] for _ in range(n)]
    for row in result.recorder.requests:
        i = row.arrival_ns // bucket
        good[i] += row.good
        if row.status == "success":
            latencies[i].append(row.latency_ns / 1e6)
    batches: list[list[int]] = [[] for _ in range(n)]
    loads = [0] * n
    loaded: list[set[str]] = [set() for _ in range(n)]
    for action in result.recorder.actions:
        i = action.sent_ns // bucket
        if i >= n or action.status != "ok":
            continue
        if action.kind == "infer":
            batches[i].append(action.batch_size)
        elif action.kind == "load":
            loads[i] += 1
            loaded[i].add(action.model)

    def pct(values: list[float], q: float) -> float:
        return float(np.percentile(values, q)) if values else float("nan")

    return {
        "goodput r/s": [g / bucket_s for g in good],
        "p50 ms": [pct(v, 50) for v in latencies],
        "p99 ms": [pct(v, 99) for v in latencies],
        "max ms": [max(v, default=float("nan")) for v in latencies],
        "batch size": [float(np.mean(b)) if b else float("nan") for b in batches],
        "cold starts /s": [c / bucket_s for c in loads],
        "models loaded": [float(len(m)) for m in loaded],
    }


def plot_over_time(results: dict[str, SimulationResult], bucket_s: float) -> None:
    """Fig. 9's time series for clockwork and INFER4 (``out/paper/fig9.png``)."""
    plt = pyplot()
    panels = (
        ("goodput r/s",),
        ("p50 ms", "p99 ms", "max ms"),
        ("batch size",),
        ("cold starts /s",),
        ("models loaded",),
    )
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2 * len(panels)), sharex=True)
    for policy in [q for q in ("clockwork", "infer4") if q in results]:
        series = over_time(results[policy], bucket_s)
        xs = [i * bucket_s for i in range(len(series["goodput r/s"]))]
        for axis, names in zip(axes, panels, strict=True):
            for name in names:
                axis.plot(xs, series[name], label=f"{policy} {name}" if len(names) > 1 else policy)
            axis.set_ylabel(names[0] if len(names) == 1 else "latency (ms)")
    axes[1].set_yscale("log")
    axes[1].legend(fontsize=6)
    axes[0].legend(fontsize=7)
    axes[-1].set_xlabel(f"seconds (buckets of {bucket_s:g} s)")
    save_plot(fig, "fig9")


def plot(results: dict[str, SimulationResult]) -> None:
    plt = pyplot()
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
    save_plot(fig, "fig10")


if __name__ == "__main__":
    main()
