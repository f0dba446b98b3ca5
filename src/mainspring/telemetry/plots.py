"""PNG plots of one or more runs (latency CDF tail, goodput and latency over time), and of a plan's
search (attainment against devices and against pool size)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mainspring.protocol import ResponseStatus
from mainspring.telemetry.recorder import Recorder
from mainspring.time import NS_PER_S, ns_to_ms


def write_plots(runs: Mapping[str, Recorder], directory: Path, slo_ms: float | None = None) -> list[Path]:
    """Write ``latency-cdf.png`` and ``over-time.png`` into ``directory``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    success = ResponseStatus.SUCCESS.value

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, recorder in runs.items():
        latencies = np.sort([ns_to_ms(r.latency_ns) for r in recorder.requests if r.status == success])
        if latencies.size == 0:
            continue
        tail = 1.0 - np.arange(latencies.size) / latencies.size
        ax.step(latencies, tail, where="post", label=policy)
    if slo_ms is not None:
        ax.axvline(slo_ms, color="grey", linestyle="--", linewidth=1, label=f"SLO {slo_ms:g} ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("latency of successful responses (ms)")
    ax.set_ylabel("fraction slower (1 - CDF)")
    ax.set_title("Latency tail")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    cdf_path = directory / "latency-cdf.png"
    fig.tight_layout()
    fig.savefig(cdf_path, dpi=110)
    plt.close(fig)

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for policy, recorder in runs.items():
        rows = recorder.requests
        if not rows:
            continue
        seconds = np.array([r.arrival_ns // NS_PER_S for r in rows])
        good = np.array([r.good for r in rows])
        bins = int(seconds.max()) + 1
        top.plot(np.arange(bins), np.bincount(seconds, weights=good, minlength=bins), label=policy, linewidth=1)
        ok = np.array([r.status == success for r in rows])
        lat = np.array([ns_to_ms(r.latency_ns) for r in rows])[ok]
        second_of_ok = seconds[ok]
        order = np.argsort(second_of_ok, kind="stable")
        groups = np.split(lat[order], np.cumsum(np.bincount(second_of_ok, minlength=bins))[:-1])
        p99 = [float(np.percentile(g, 99)) if g.size else np.nan for g in groups]
        bottom.plot(np.arange(bins), p99, label=policy, linewidth=1)
    top.set_ylabel("goodput (r/s)")
    top.legend()
    bottom.set_ylabel("p99 latency (ms)")
    bottom.set_yscale("log")
    bottom.set_xlabel("time of arrival (s)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    time_path = directory / "over-time.png"
    fig.tight_layout()
    fig.savefig(time_path, dpi=110)
    plt.close(fig)
    return [cdf_path, time_path]


GIB = 1024**3


class PlannedPoint(Protocol):
    """What the plan plot reads of a simulated point (``sim/plan.py``'s ``PlanPoint``)."""

    @property
    def devices(self) -> int: ...
    @property
    def pool_bytes(self) -> int: ...
    @property
    def attainment(self) -> float: ...
    @property
    def complete(self) -> bool: ...


class PlanSearch(Protocol):
    """What the plan plot reads of a plan (``sim/plan.py``'s ``Plan``)."""

    @property
    def points(self) -> Sequence[PlannedPoint]: ...
    @property
    def target(self) -> float: ...
    @property
    def devices(self) -> int | None: ...


def plot_plan(result: PlanSearch, path: Path) -> None:
    """Attainment against devices (at the full pool) and against pool size (at the planned devices),
    points stopped early marked as the bounds they are."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = max((p.pool_bytes for p in result.points), default=0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    panels: list[tuple[Any, list[PlannedPoint], Callable[[PlannedPoint], float]]] = [
        (left, [p for p in result.points if p.pool_bytes == full], lambda p: p.devices),
        (right, [p for p in result.points if p.devices == result.devices], lambda p: p.pool_bytes / GIB),
    ]
    for axis, points, x_of in panels:
        for complete, style in ((True, {"marker": "o"}), (False, {"marker": "v", "linestyle": "none"})):
            chosen = sorted((x_of(p), p.attainment) for p in points if p.complete is complete)
            if chosen:
                label = "simulated" if complete else "stopped early: at most"
                axis.plot(*zip(*chosen, strict=True), label=label, **style)
        axis.axhline(result.target, linestyle=":", color="grey")
        axis.set_ylabel("within SLO")
        if points:
            axis.legend(loc="lower right")
    left.set_xlabel(f"devices (pool {full / GIB:g} GiB each)")
    planned = "no plan" if result.devices is None else f"{result.devices} device" + "s" * (result.devices != 1)
    right.set_xlabel(f"pool per device (GiB), {planned}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
