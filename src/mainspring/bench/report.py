"""What a bench run shows: the simulator's figures for the requests a client saw, and the driver's lag."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mainspring.bench.driver import DriveResult, Sent
from mainspring.protocol import ResponseStatus
from mainspring.telemetry.recorder import Recorder, RequestRow
from mainspring.time import NS_PER_S, ns_to_ms

PERCENTILES = {"p50": 50.0, "p99": 99.0, "p99.9": 99.9, "p99.99": 99.99}
LAG_WARNING_MS = 1.0


def _percentiles(values_ms: Sequence[float]) -> dict[str, float]:
    if not values_ms:
        return {**dict.fromkeys(PERCENTILES, 0.0), "max": 0.0}
    data = np.asarray(values_ms)
    return {**{k: float(np.percentile(data, q)) for k, q in PERCENTILES.items()}, "max": float(data.max())}


def summarize(rows: Sequence[Sent], duration_ns: int) -> dict[str, Any]:
    seconds = duration_ns / NS_PER_S
    good = sum(r.good for r in rows)
    by_status = collections.Counter(r.status for r in rows)
    succeeded = by_status[ResponseStatus.SUCCESS]
    reasons = collections.Counter(r.reason for r in rows if r.status is not ResponseStatus.SUCCESS)
    return {
        "requests": len(rows),
        "offered_rps": len(rows) / seconds,
        "goodput_rps": good / seconds,
        "slo_attainment": good / len(rows) if rows else 1.0,
        "succeeded": succeeded,
        "late": succeeded - good,
        "rejected": by_status[ResponseStatus.REJECTED],
        "timed_out": by_status[ResponseStatus.TIMED_OUT],
        "errors": by_status[ResponseStatus.ERROR],
        "reasons": dict(reasons.most_common()),
        "latency_ms": _percentiles(
            [ns_to_ms(r.answered_ns - r.scheduled_ns) for r in rows if r.status is ResponseStatus.SUCCESS]
        ),
    }


def build(result: DriveResult) -> dict[str, Any]:
    rows = result.sent
    report = summarize(rows, result.duration_ns)
    report["send_lag_ms"] = _percentiles([ns_to_ms(r.sent_ns - r.scheduled_ns) for r in rows])
    report["unanswered"] = result.unanswered
    models: dict[str, list[Sent]] = collections.defaultdict(list)
    for row in rows:
        models[row.model].append(row)
    report["by_model"] = {m: summarize(models[m], result.duration_ns) for m in sorted(models)}
    return report


def format_report(report: dict[str, Any], top_models: int = 10) -> str:
    lat, lag = report["latency_ms"], report["send_lag_ms"]
    lines = [
        f"requests              {report['requests']}",
        f"offered (r/s)         {report['offered_rps']:.1f}",
        f"goodput (r/s)         {report['goodput_rps']:.1f}",
        f"SLO attainment        {report['slo_attainment']:.4%}",
        f"late successes        {report['late']}",
        f"rejected / timed out  {report['rejected']} / {report['timed_out']}",
        f"errors                {report['errors']}",
        "latency (ms)          " + " ".join(f"{k} {v:.2f}" for k, v in lat.items()),
        "send lag (ms)         " + " ".join(f"{k} {v:.2f}" for k, v in lag.items()),
    ]
    for reason, count in list(report["reasons"].items())[:8]:
        lines.append(f"  {count:>8}  {reason}")
    if lag["p99"] > LAG_WARNING_MS:
        lines.append(f"warning: 1% of requests left more than {lag['p99']:.1f} ms late (above {LAG_WARNING_MS:g} "
                     "ms); latencies count from the scheduled time, so they include it")  # fmt: skip
    if report["unanswered"]:
        lines.append(f"warning: {report['unanswered']} request(s) had no answer when the driver gave up")
    worst = sorted(report["by_model"].items(), key=lambda item: item[1]["slo_attainment"])[:top_models]
    if len(report["by_model"]) > 1:
        lines.append("models (worst attainment first): model requests goodput attainment p99 ms")
        for model, part in worst:
            lines.append(f"  {model:<24} {part['requests']:>8} {part['goodput_rps']:>8.1f} "
                         f"{part['slo_attainment']:>9.4%} {part['latency_ms']['p99']:>8.2f}")  # fmt: skip
    return "\n".join(lines)


def as_recorder(rows: Sequence[Sent]) -> Recorder:
    """The client's view as the simulator's request log, so that its plots draw a bench run too."""
    recorder = Recorder()
    recorder.received = len(rows)
    recorder.requests = [
        RequestRow(r.index, r.model, r.scheduled_ns, r.scheduled_ns + r.slo_ns, r.answered_ns, r.status.value,
                   r.reason, -1, False, r.reason if r.status is not ResponseStatus.SUCCESS else "served")
        for r in rows
    ]  # fmt: skip
    return recorder


COLUMNS = ("index", "model", "label", "scheduled_ns", "sent_ns", "answered_ns", "slo_ns", "status", "reason")


def write_log(rows: Sequence[Sent], path: Path) -> None:
    """The request log as TSV, one row per request in schedule order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        out.write("\t".join(COLUMNS) + "\n")
        for r in sorted(rows, key=lambda r: r.index):
            reason = r.reason.replace("\t", " ").replace("\n", " ")
            out.write(f"{r.index}\t{r.model}\t{r.label}\t{r.scheduled_ns}\t{r.sent_ns}\t{r.answered_ns}\t"
                      f"{r.slo_ns}\t{r.status.value}\t{reason}\n")  # fmt: skip
