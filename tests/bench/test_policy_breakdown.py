"""benchmarks/policy_breakdown.py puts each part of the policy's time under the pass it belongs to."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from policy_breakdown import STEPS, breakdown, visits


def test_every_arrival_after_the_warm_up_is_counted_and_the_steps_sit_inside_their_passes() -> None:
    parts, requests = breakdown(devices=2, rate_per_device=150.0, warmup_s=0.5, duration_s=0.5)
    assert requests > 0
    assert parts.calls[("arrival", "on_request")] == requests
    assert parts.calls[("arrival", "pass")] == requests  # the simulator runs a pass after every arrival
    assert parts.calls[("wake-up", "weighing")] > 0  # batches are planned at wake-ups
    for kind in ("arrival", "result", "wake-up"):
        outer = parts.cpu[(kind, "pass")]
        for label in ("load planning", "strand check", "next wake-up", "planning infers"):
            assert parts.cpu[(kind, label)] <= outer
    assert {label for _, _, label in STEPS} >= {label for _, label in parts.cpu} - {"on_request", "on_result", "pass"}


def test_the_visit_count_sees_each_waiting_model_on_every_device_that_holds_it() -> None:
    seen, requests = visits(devices=2, rate_per_device=150.0, warmup_s=0.5, duration_s=0.5)
    assert seen.weighings > 0 and requests > 0
    assert seen.waiting >= seen.weighings  # a device is weighed only while some model waits on it
    assert seen.waiting <= seen.holders <= 2 * seen.waiting  # each waiting model is held by one or both devices
