"""Every policy means one thing by ``Infer.deadlines_ns``: when the request's result must be ready at
the worker, its deadline less the controller's margin for the answer's trip back."""

from __future__ import annotations

import random

import pytest

from mainspring.protocol import DeviceSpec, Infer
from mainspring.scheduler.registry import make_scheduler
from mainspring.time import NS_PER_MS
from tests.fakes import PAGE, ok, profile, request

MARGIN_NS = 3 * NS_PER_MS


@pytest.mark.parametrize("policy", ["clockwork", "infer4"])
def test_an_infer_carries_each_deadline_less_the_margin(policy: str) -> None:
    devices = [DeviceSpec(0, "v100", 64 * PAGE, PAGE)]
    scheduler = make_scheduler(policy, {"m": profile("m")}, devices, random.Random(0), MARGIN_NS)
    asked = request(1, "m", 0, slo_ms=200)
    scheduler.on_request(asked, 0)
    now = 0
    for _ in range(50):
        for action in scheduler.schedule(now).actions:
            if isinstance(action, Infer):
                assert action.deadlines_ns == (asked.deadline_ns - MARGIN_NS,)
                return
            begin = max(now, action.earliest_ns)
            scheduler.on_result(ok(action.action_id, 0, begin, begin + action.expected_duration_ns), now)
        now += NS_PER_MS
    raise AssertionError("no batch was planned")
