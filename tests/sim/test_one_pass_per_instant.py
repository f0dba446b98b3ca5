"""The simulator runs one scheduling pass for all the events of an instant, as a live controller
runs one per turn of its event loop: a closed loop's clients, answered by one batch, send their
next requests at one instant, and those are planned together."""

from __future__ import annotations

from collections import Counter

import pytest

from mainspring.models.profile import builtin_profiles
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import ClosedLoop


@pytest.mark.parametrize("policy", ["clockwork", "infer4"])
def test_a_closed_loop_answered_together_is_batched_together(policy: str) -> None:
    models = [p for p in builtin_profiles() if p.model == "resnet50_v2"]
    config = SimulationConfig(duration_ns=s_to_ns(1), devices=1, slo_ns=ms_to_ns(100), seed=1)
    planned = simulate(policy, models, ClosedLoop(8), config)
    reactive = simulate("triton", models, ClosedLoop(8), config)
    batches = Counter(row.requests for row in planned.recorder.actions if row.kind == "infer")
    # One pass per event would take the first of the 8 alone onto the free lane (1 then 7, or 2 and 6).
    assert set(batches) == {8}, batches
    assert planned.report.slo_attainment == 1.0
    assert planned.report.goodput_rps >= reactive.report.goodput_rps
