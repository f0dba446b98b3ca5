"""Every policy means one thing by ``Infer.deadlines_ns``: when the request's result must be ready at
the worker, its deadline less the controller's margin for the answer's trip back (``Request.ready_by_ns``,
set where the request is built); the request's own ``deadline_ns`` stays its arrival plus its SLO."""

from __future__ import annotations

import random

import pytest

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.protocol import ActionResult, DeviceSpec, Infer, Request
from mainspring.scheduler.base import Decisions, Scheduler
from mainspring.scheduler.registry import make_scheduler, policy_names
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import NS_PER_MS, NS_PER_S
from mainspring.workload import PoissonOpenLoop
from tests.fakes import PAGE, ok, profile, request

MARGIN_NS = 3 * NS_PER_MS


@pytest.mark.parametrize("policy", policy_names())
def test_an_infer_carries_each_deadline_less_the_margin(policy: str) -> None:
    devices = [DeviceSpec(0, "v100", 64 * PAGE, PAGE)]
    scheduler = make_scheduler(policy, {"m": profile("m")}, devices, random.Random(0), MARGIN_NS)
    asked = request(1, "m", 0, slo_ms=200, margin_ns=MARGIN_NS)
    assert asked.deadline_ns == 200 * NS_PER_MS
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


class KeepingInfers:
    """The policy, keeping every ``Infer`` it hands out."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.infers: list[Infer] = []

    def on_request(self, request: Request, now_ns: int) -> None:
        self.inner.on_request(request, now_ns)

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        self.inner.on_result(result, now_ns)

    def schedule(self, now_ns: int) -> Decisions:
        decisions = self.inner.schedule(now_ns)
        self.infers.extend(a for a in decisions.actions if isinstance(a, Infer))
        return decisions


@pytest.mark.parametrize("policy", policy_names())
def test_a_simulated_run_sends_each_deadline_less_its_network_latency(policy: str) -> None:
    """The simulator builds its requests as the live controller does: what reaches a worker is every
    request's arrival + SLO less the network latency, the margin of the answer's trip back."""
    latency_ns = 2 * NS_PER_MS
    kept: list[KeepingInfers] = []

    def keep(scheduler: Scheduler) -> Scheduler:
        kept.append(KeepingInfers(scheduler))
        return kept[-1]

    config = SimulationConfig(NS_PER_S // 2, 2, slo_ns=60 * NS_PER_MS, seed=1, network_latency_ns=latency_ns)
    result = simulate(policy, model_copies(builtin_profiles(), 8), PoissonOpenLoop(400.0), config, wrap=keep)
    answered = {row.request_id: row for row in result.recorder.requests}
    (policy_seen,) = kept
    assert len(policy_seen.infers) > 10
    for infer in policy_seen.infers:
        rows = [answered[r] for r in infer.request_ids]
        assert all(row.deadline_ns == row.arrival_ns + 60 * NS_PER_MS for row in rows)
        assert infer.deadlines_ns == tuple(row.deadline_ns - latency_ns for row in rows)
