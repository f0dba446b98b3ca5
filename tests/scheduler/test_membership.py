"""Devices and models that come and go (``Membership``), for every policy, fed by hand."""

from __future__ import annotations

import random

import pytest

from mainspring.protocol import (
    Action,
    ActionResult,
    ActionStatus,
    DeviceSpec,
    Infer,
    LoadWeights,
    Outcome,
    Response,
    ResponseStatus,
    Timing,
)
from mainspring.scheduler.base import Membership, Scheduler
from mainspring.scheduler.registry import make_scheduler
from mainspring.time import NS_PER_MS
from tests.fakes import PAGE, ok, profile, request

MS = NS_PER_MS
POLICIES = ["clockwork", "infer4", "triton", "clipper"]


def spec(device: int) -> DeviceSpec:
    return DeviceSpec(device, "v100", 16 * PAGE, PAGE)


class Harness:
    """A policy with a clock in the test's hands; remembers every answer and checks there is one per request."""

    def __init__(self, policy: str, devices: list[int]) -> None:
        self.policy: Scheduler = make_scheduler(
            policy, {"a": profile("a"), "b": profile("b")}, [spec(d) for d in devices], random.Random(0)
        )
        assert isinstance(self.policy, Membership)
        self.members: Membership = self.policy
        self.now = 0
        self.answers: dict[int, Response] = {}
        self.sent: list[Action] = []
        self.wakeup: int | None = None

    def step(self, to_ns: int) -> list[Action]:
        self.now = to_ns
        decisions = self.policy.schedule(to_ns)
        for response in decisions.responses:
            assert response.request_id not in self.answers, f"request {response.request_id} answered twice"
            self.answers[response.request_id] = response
        self.sent += decisions.actions
        self.wakeup = decisions.wakeup_ns
        return decisions.actions

    def finish(self, action: Action, at_ns: int) -> None:
        duration = max(1, action.expected_duration_ns)
        self.policy.on_result(ok(action.action_id, action.device, at_ns - duration, at_ns), at_ns)

    def run_until_quiet(self, until_ns: int) -> None:
        """Complete every action the policy sends at its expected end, honouring wake-ups, until nothing is left."""
        pending: list[tuple[int, int, Action]] = []
        for action in self.step(self.now):
            pending.append(
                (max(self.now, action.earliest_ns) + max(1, action.expected_duration_ns), action.action_id, action)
            )
        while self.now < until_ns:
            pending.sort(key=lambda p: p[:2])
            wake = self.wakeup if self.wakeup is not None and self.wakeup > self.now else None
            if pending and (wake is None or pending[0][0] <= wake):
                end, _, action = pending.pop(0)
                self.finish(action, end)
                new = self.step(end)
            elif wake is not None:
                new = self.step(wake)
            else:
                return
            for action in new:
                start = max(self.now, action.earliest_ns)
                pending.append((start + max(1, action.expected_duration_ns), action.action_id, action))


@pytest.mark.parametrize("policy", POLICIES)
def test_requests_of_a_lost_device_are_served_by_one_that_joins(policy: str) -> None:
    h = Harness(policy, [0])
    for i in range(3):
        h.policy.on_request(request(i, "a", 0, slo_ms=500), 0)
    actions = h.step(0)
    load = next(a for a in actions if isinstance(a, LoadWeights))
    h.finish(load, 5 * MS)
    infers = [a for a in h.step(5 * MS) if isinstance(a, Infer)]
    assert infers and all(a.device == 0 for a in infers)
    h.members.add_device(spec(1))
    h.members.remove_device(0, 6 * MS)  # its results will never come
    h.now = 6 * MS
    h.run_until_quiet(400 * MS)
    assert set(h.answers) == {0, 1, 2}
    assert all(r.status is ResponseStatus.SUCCESS for r in h.answers.values())
    assert any(isinstance(a, Infer) and a.device == 1 for a in h.sent)


@pytest.mark.parametrize("policy", POLICIES)
def test_without_any_device_requests_get_an_error_at_once(policy: str) -> None:
    h = Harness(policy, [0])
    h.policy.on_request(request(1, "a", 0, slo_ms=500), 0)
    h.step(0)
    h.members.remove_device(0, 1 * MS)
    h.step(1 * MS)
    h.policy.on_request(request(2, "a", 2 * MS), 2 * MS)
    h.step(2 * MS)
    assert {i: r.status for i, r in h.answers.items()} == {1: ResponseStatus.ERROR, 2: ResponseStatus.ERROR}
    assert "no worker" in h.answers[2].reason


def test_a_lost_request_that_cannot_make_its_deadline_elsewhere_gets_an_error() -> None:
    h = Harness("clockwork", [0, 1])
    h.policy.on_request(request(1, "a", 0, slo_ms=10), 0)
    load = next(a for a in h.step(0) if isinstance(a, LoadWeights))
    h.finish(load, 5 * MS)
    (infer,) = [a for a in h.step(5 * MS) if isinstance(a, Infer)]
    h.members.remove_device(infer.device, 9 * MS)  # 1 ms left; the fastest batch takes 2
    h.step(9 * MS)
    assert h.answers[1].status is ResponseStatus.ERROR and "lost" in h.answers[1].reason


@pytest.mark.parametrize("policy", POLICIES)
def test_models_are_added_and_removed_while_serving(policy: str) -> None:
    h = Harness(policy, [0])
    h.policy.on_request(request(1, "c", 0), 0)
    h.step(0)
    assert h.answers[1].status is ResponseStatus.ERROR and "unknown model" in h.answers[1].reason
    h.members.add_model(profile("c"))
    h.policy.on_request(request(2, "c", 1 * MS), 1 * MS)
    h.now = 1 * MS
    h.run_until_quiet(100 * MS)
    assert h.answers[2].status is ResponseStatus.SUCCESS
    for i in (3, 4):
        h.policy.on_request(request(i, "c", h.now, slo_ms=500), h.now)
    in_flight = h.step(h.now)
    h.members.remove_model("c", h.now)
    h.step(h.now)
    assert h.answers[3].status is h.answers[4].status is ResponseStatus.ERROR
    assert "unloaded" in h.answers[3].reason
    for action in in_flight:  # late results of the removed model are ignored
        h.finish(action, h.now + 10 * MS)
    h.policy.on_request(request(5, "a", h.now + 10 * MS), h.now + 10 * MS)
    h.now += 10 * MS
    h.run_until_quiet(h.now + 100 * MS)
    assert h.answers[5].status is ResponseStatus.SUCCESS


@pytest.mark.parametrize("policy", POLICIES)
def test_a_late_result_of_a_model_removed_and_added_again_is_ignored(policy: str) -> None:
    h = Harness(policy, [0])
    h.policy.on_request(request(1, "a", 0, slo_ms=500), 0)
    h.run_until_quiet(50 * MS)  # "a" is resident and served
    h.policy.on_request(request(2, "a", h.now, slo_ms=500), h.now)
    in_flight = [a for a in h.step(h.now) if isinstance(a, Infer)]
    while not in_flight and h.wakeup is not None:  # a batching delay (the reactive baselines)
        in_flight = [a for a in h.step(h.wakeup) if isinstance(a, Infer)]
    assert in_flight
    h.members.remove_model("a", h.now)
    h.members.add_model(profile("a"))
    for action in in_flight:  # the old residency's result arrives after the model came back
        h.finish(action, h.now + 2 * MS)
    h.now += 2 * MS
    h.policy.on_request(request(3, "a", h.now, slo_ms=500), h.now)
    h.run_until_quiet(h.now + 200 * MS)
    assert h.answers[2].status is ResponseStatus.ERROR and "unloaded" in h.answers[2].reason
    assert h.answers[3].status is ResponseStatus.SUCCESS


@pytest.mark.parametrize("policy", POLICIES)
def test_a_device_that_joins_holding_weights_serves_them_without_a_load(policy: str) -> None:
    # A worker rejoining a restarted controller reports what it holds; models the controller does not
    # serve are ignored. The pool fits one model: serving "b" must evict "a" first (its pages are booked).
    h = Harness(policy, [0])
    h.members.remove_device(0, 0)
    h.members.add_device(DeviceSpec(1, "v100", 2 * PAGE, PAGE, resident=("retired", "a")))
    h.policy.on_request(request(1, "a", 0, slo_ms=500), 0)
    h.run_until_quiet(400 * MS)
    assert h.answers[1].status is ResponseStatus.SUCCESS
    assert [type(a).__name__ for a in h.sent] == ["Infer"]
    h.policy.on_request(request(2, "b", h.now, slo_ms=500), h.now)
    h.run_until_quiet(h.now + 400 * MS)
    assert h.answers[2].status is ResponseStatus.SUCCESS
    kinds = [(type(a).__name__, a.model) for a in h.sent[1:]]
    assert kinds.index(("EvictWeights", "a")) < kinds.index(("LoadWeights", "b")), kinds


@pytest.mark.parametrize("policy", POLICIES)
def test_a_failed_batch_answers_each_request_by_what_its_worker_found(policy: str) -> None:
    # As the worker reports each batch run alone: request 1's input failed (400), request 2 could not
    # be checked before its deadline (500), the others were served.
    h = Harness(policy, [0])
    for i in range(3):
        h.policy.on_request(request(i, "a", 0, slo_ms=500), 0)
    h.finish(next(a for a in h.step(0) if isinstance(a, LoadWeights)), 5 * MS)
    for now in range(6 * MS, 100 * MS, MS):
        for infer in [a for a in h.step(now) if isinstance(a, Infer)]:
            assert len(infer.deadlines_ns) == len(infer.request_ids)  # each request's deadline, for the worker
            assert all(d <= 500 * MS for d in infer.deadlines_ns)
            ids = infer.request_ids
            result = ActionResult(
                infer.action_id, 0, ActionStatus.OK, Timing(now, now + MS), "IndexError: bad id",
                [{} if i in (1, 2) else {"y": 1} for i in ids],
                {p: "IndexError: bad id" for p, i in enumerate(ids) if i == 1},
                tuple(p for p, i in enumerate(ids) if i == 2),
            )  # fmt: skip
            h.policy.on_result(result, now + MS)
    h.step(100 * MS)
    outcomes = {i: (r.outcome, r.status) for i, r in h.answers.items()}
    assert outcomes == {
        0: (Outcome.SERVED, ResponseStatus.SUCCESS),
        1: (Outcome.INPUT_FAILED, ResponseStatus.ERROR),
        2: (Outcome.INFERENCE_FAILED, ResponseStatus.ERROR),
    }
    assert "no time to run this request alone" in h.answers[2].reason
