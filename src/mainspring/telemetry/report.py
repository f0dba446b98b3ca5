"""Run reports: what a run achieved, per policy, as a table and as JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mainspring.protocol import ResponseStatus
from mainspring.telemetry.recorder import Recorder, RequestRow
from mainspring.time import NS_PER_S, ns_to_ms

LATENCY_PERCENTILES = {"p50": 50.0, "p99": 99.0, "p999": 99.9, "p9999": 99.99}


@dataclass(frozen=True)
class RunReport:
    policy: str
    workload: str
    devices: int
    models: int
    requests: int
    offered_rps: float
    throughput_rps: float
    goodput_rps: float
    slo_attainment: float
    succeeded: int
    late: int
    rejected: int
    timed_out: int
    errors: int
    latency_ms: dict[str, float]
    cold_starts: int
    loads: int
    evictions: int
    device_busy: float
    prediction_error_ms: dict[str, float]
    refused_actions: int
    simulated_s: float
    wall_s: float
    events: int
    by_label: dict[str, dict[str, float]]  # per workload part: requests, goodput_rps, slo_attainment
    # the policy's own CPU time (its thread's), to size a controller: per request and per simulated second
    policy_cpu_us_per_request: float = 0.0
    policy_cpu_s_per_sim_s: float = 0.0
    warmup_s: float = 0.0  # arrivals before this were served but not counted

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _percentiles(values: Sequence[float] | np.ndarray, prefix: str = "") -> dict[str, float]:
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return {f"{prefix}{name}": 0.0 for name in (*LATENCY_PERCENTILES, "max")}
    out = {f"{prefix}{name}": float(np.percentile(data, q)) for name, q in LATENCY_PERCENTILES.items()}
    out[f"{prefix}max"] = float(data.max())
    return out


def build_report(
    recorder: Recorder,
    *,
    policy: str,
    workload: str,
    devices: int,
    models: int,
    duration_ns: int,
    simulated_ns: int,
    wall_s: float,
    events: int = 0,
    labels: Mapping[int, str] | None = None,
    policy_cpu_ns: int = 0,
    counted_from_ns: int = 0,
) -> RunReport:
    """Summarise a finished run. Rates are per second of the arrival window ``duration_ns``; with
    ``counted_from_ns`` (a warm-up), only requests that arrived and actions that began from then on."""
    rows = [r for r in recorder.requests if r.arrival_ns >= counted_from_ns]
    actions = [a for a in recorder.actions if a.sent_ns >= counted_from_ns]
    seconds = max(duration_ns, 1) / NS_PER_S
    success = ResponseStatus.SUCCESS.value
    counts = {status.value: 0 for status in ResponseStatus}
    for row in rows:
        counts[row.status] += 1
    good = sum(1 for r in rows if r.good)
    latencies = [ns_to_ms(r.latency_ns) for r in rows if r.status == success]
    ok_actions = [a for a in actions if a.status == "ok"]
    busy_ns = sum(a.end_ns - a.begin_ns for a in ok_actions if a.kind == "infer")
    errors: dict[str, list[float]] = {"infer": [], "load": []}
    for a in ok_actions:
        if a.kind in errors:
            errors[a.kind].append(ns_to_ms((a.end_ns - a.begin_ns) - a.expected_ns))
    prediction = {}
    for kind, values in errors.items():
        stats = _percentiles(values, f"{kind}_")
        prediction.update({k: stats[k] for k in (f"{kind}_p50", f"{kind}_p99", f"{kind}_max")})
    return RunReport(
        policy=policy,
        workload=workload,
        devices=devices,
        models=models,
        requests=len(rows),
        offered_rps=(recorder.received if not counted_from_ns else len(rows)) / seconds,
        throughput_rps=counts[success] / seconds,
        goodput_rps=good / seconds,
        slo_attainment=good / len(rows) if rows else 1.0,
        succeeded=counts[success],
        late=counts[success] - good,
        rejected=counts[ResponseStatus.REJECTED.value],
        timed_out=counts[ResponseStatus.TIMED_OUT.value],
        errors=counts[ResponseStatus.ERROR.value],
        latency_ms=_percentiles(latencies),
        cold_starts=sum(1 for r in rows if r.cold),
        loads=sum(1 for a in ok_actions if a.kind == "load"),
        evictions=sum(1 for a in ok_actions if a.kind == "evict"),
        device_busy=busy_ns / (max(simulated_ns - counted_from_ns, 1) * max(devices, 1)),
        prediction_error_ms=prediction,
        refused_actions=len(actions) - len(ok_actions),
        simulated_s=simulated_ns / NS_PER_S,
        wall_s=wall_s,
        events=events,
        by_label=_by_label(rows, labels or {}, seconds),
        policy_cpu_us_per_request=policy_cpu_ns / 1000 / max(len(recorder.requests), 1),  # warm-up included
        policy_cpu_s_per_sim_s=policy_cpu_ns / max(simulated_ns, 1),
        warmup_s=counted_from_ns / NS_PER_S,
    )


def _by_label(rows: Sequence[RequestRow], labels: Mapping[int, str], seconds: float) -> dict[str, dict[str, float]]:
    """Attainment and goodput of each labelled part of the workload."""
    if not labels:
        return {}
    totals: dict[str, list[int]] = {}
    for row in rows:
        label = labels.get(row.request_id)
        if label is not None:
            counts = totals.setdefault(label, [0, 0])
            counts[0] += 1
            counts[1] += row.good
    return {
        label: {"requests": n, "goodput_rps": good / seconds, "slo_attainment": good / n if n else 1.0}
        for label, (n, good) in sorted(totals.items())
    }


_ROWS: list[tuple[str, str]] = [
    ("requests", "{requests}"),
    ("offered load (r/s)", "{offered_rps:.1f}"),
    ("throughput (r/s)", "{throughput_rps:.1f}"),
    ("goodput (r/s)", "{goodput_rps:.1f}"),
    ("SLO attainment", "{slo_attainment:.6%}"),
    ("late successes", "{late}"),
    ("rejected", "{rejected}"),
    ("timed out", "{timed_out}"),
    ("errors", "{errors}"),
    ("latency p50 (ms)", "{latency_ms[p50]:.2f}"),
    ("latency p99 (ms)", "{latency_ms[p99]:.2f}"),
    ("latency p99.9 (ms)", "{latency_ms[p999]:.2f}"),
    ("latency p99.99 (ms)", "{latency_ms[p9999]:.2f}"),
    ("latency max (ms)", "{latency_ms[max]:.2f}"),
    ("cold starts", "{cold_starts}"),
    ("loads / evictions", "{loads} / {evictions}"),
    ("device busy", "{device_busy:.1%}"),
    ("infer error p50/p99 (ms)", "{prediction_error_ms[infer_p50]:+.3f} / {prediction_error_ms[infer_p99]:+.3f}"),
    ("load error p50/p99 (ms)", "{prediction_error_ms[load_p50]:+.3f} / {prediction_error_ms[load_p99]:+.3f}"),
    ("refused actions", "{refused_actions}"),
    ("simulated / wall (s)", "{simulated_s:.1f} / {wall_s:.2f}"),
    ("policy CPU (us/request)", "{policy_cpu_us_per_request:.1f}"),
    ("policy CPU (s / sim s)", "{policy_cpu_s_per_sim_s:.3f}"),
]


def format_table(reports: Sequence[RunReport]) -> str:
    """Policies side by side, one metric a row."""
    if not reports:
        return "(no runs)"
    header = ["metric", *(r.policy for r in reports)]
    body = [[label, *(fmt.format(**r.to_json()) for r in reports)] for label, fmt in _ROWS]
    for part in sorted({label for r in reports for label in r.by_label}):
        cells = [f"{r.by_label[part]['slo_attainment']:.4%}" if part in r.by_label else "-" for r in reports]
        body.append([f"attainment [{part}]", *cells])
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    first = reports[0]
    warmup = f"; counted after a {first.warmup_s:g} s warm-up" if first.warmup_s else ""
    lines = [f"{first.workload}; {first.models} models on {first.devices} devices{warmup}"]
    for row in [header, *body]:
        cells = [
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells))
    return "\n".join(lines)
