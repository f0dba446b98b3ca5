"""The side-by-side scenarios' own arithmetic (benchmarks/scenarios.py): how recovery after a burst
is measured and what BENCHMARKS.md says. The peers themselves are never run here (their own
environments, never part of the test suite)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from mainspring.bench.driver import Sent
from mainspring.protocol import ResponseStatus
from scenario_report import write_markdown
from scenarios import burst_recovery_ms

MS = 1_000_000


def sent(index: int, scheduled_ms: float, answered_ms: float) -> Sent:
    return Sent(index, "m", "", int(scheduled_ms * MS), int(scheduled_ms * MS), int(answered_ms * MS), 100 * MS,
                ResponseStatus.SUCCESS, "")  # fmt: skip


def test_recovery_is_from_a_bursts_last_arrival_to_its_last_answer() -> None:
    rows = [
        sent(0, 0, 30), sent(1, 100, 400), sent(2, 200, 250),  # burst 1 ends at 200, drained at 400
        sent(3, 2000, 2010), sent(4, 2050, 2060),  # 1.8 s of silence: burst 2, drained 10 ms after its end
    ]  # fmt: skip
    assert burst_recovery_ms(rows) == pytest.approx([200.0, 10.0])


def run(attainment: float, goodput: float, **extra: Any) -> dict[str, Any]:
    return {"requests": 100, "offered_rps": 10.0, "goodput_rps": goodput, "slo_attainment": attainment, "late": 0,
            "rejected": 1, "timed_out": 0, "errors": 0, "p50_ms": 5.0, "p99_ms": 9.0, "send_lag_p99_ms": 1.0,
            "reasons": {}, "slo_ms": 100.0, **extra}  # fmt: skip


def test_report_shows_every_server_the_goodput_ratio_and_the_smallest_slo_held(tmp_path: Path) -> None:
    calibration = {"batch1_ms": 16.0, "max_batch_ms": 29.0, "max_batch": 8, "capacity_rps": 276.0, "weights_mib": 44.6}
    results = {
        "calibration": {"resnet18": calibration},
        "runs": [{"started": "2026-11-30 06:00", "servers": "x", "scenarios": "S3,S5", "seconds": 20}],
        "S3": {
            "20 r/s": {
                "mainspring": [run(0.999, 20.0), run(0.995, 19.0)],
                "triton-expert": [run(0.9, 10.0), run(0.8, 8.0)],
            }
        },
        "S5": {
            "2x": {"mainspring": [run(0.98, 9.0, slo_ms=32.0)], "triton-expert": [run(0.5, 5.0, slo_ms=32.0)]},
            "3x": {"mainspring": [run(0.995, 9.9, slo_ms=48.0)], "triton-expert": [run(0.97, 9.7, slo_ms=48.0)]},
            "5x": {"mainspring": [run(1.0, 10.0, slo_ms=80.0)], "triton-expert": [run(0.995, 9.9, slo_ms=80.0)]},
        },
    }
    path = tmp_path / "BENCHMARKS.md"
    write_markdown(results, path)
    text = path.read_text()
    summary = text.split("## Summary")[1].split("##")[0]
    # repeats show as a range; the ratio is per repeat: 20/10 and 19/8
    assert "| S3 | 20 r/s | 99.50-99.90% (19.0-20.0) | 80.00-90.00% (8.0-10.0) | 2.00-2.38x |" in summary
    assert "mainspring 48 ms, triton-expert 80 ms" in text
    assert "batch 1 16.0 ms, batch 8 29.0 ms, 276.0 r/s" in text
