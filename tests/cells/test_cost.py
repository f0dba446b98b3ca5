"""The cost model's terms: what a controller core is charged for each call, the live process around the
policy included, and what a turn then takes on the simulated clock."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import pytest

from mainspring.cells.cost import CLOCKWORK_COST, FREE, ControllerCost, CostedScheduler, FrontendCost, ProcessCost
from mainspring.protocol import Action, ActionResult, ActionStatus, Infer, Outcome, Request, Response
from mainspring.scheduler.base import Decisions
from mainspring.sim.core import ControllerCore
from mainspring.sim.engine import EventLoop
from mainspring.time import NS_PER_MS

POLICY = ControllerCost(request_ns=1_000, result_ns=2_000, pass_ns=300, pass_per_device_ns=10, action_ns=4_000,
                        answer_ns=50)  # fmt: skip
PROCESS = ProcessCost(request_ns=20_000, answer_ns=30_000, action_ns=40_000, result_ns=50_000, refusal_ns=7_000)


class Scripted:
    """A policy whose passes decide what the test says."""

    def __init__(self) -> None:
        self.next: Decisions = Decisions([], [])

    def on_request(self, request: Request, now_ns: int) -> None:
        pass

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        pass

    def schedule(self, now_ns: int) -> Decisions:
        decisions, self.next = self.next, Decisions([], [])
        return decisions


def request(i: int) -> Request:
    """What the scripted policy is handed (it never reads it): the cost is per call."""
    return cast("Request", i)


def decided(actions: int, answers: int) -> Decisions:
    planned: list[Action] = [Infer(i, 0, "m", 0, NS_PER_MS, 1, (i,), 1) for i in range(actions)]
    return Decisions(planned, [Response(i, Outcome.SERVED) for i in range(answers)])


def test_each_call_is_charged_the_policy_and_the_process_around_it() -> None:
    policy = Scripted()
    costed = CostedScheduler(policy, replace(POLICY, process=PROCESS), devices=4)
    costed.on_request(request(1), 0)
    assert costed.take() == 1_000 + 20_000
    costed.on_result(ActionResult(1, 0, ActionStatus.OK), 0)
    assert costed.take() == 2_000 + 50_000
    policy.next = decided(actions=2, answers=3)
    costed.schedule(0)
    assert costed.take() == (300 + 10 * 4 + 2 * 4_000 + 3 * 50) + 2 * 40_000 + 3 * 30_000
    costed.refuse()  # never reached the policy: only the process's refusal
    assert costed.take() == 7_000


def test_a_background_share_makes_every_charge_take_longer_in_proportion() -> None:
    costed = CostedScheduler(Scripted(), replace(POLICY, process=replace(PROCESS, background=0.2)), devices=1)
    costed.on_request(request(1), 0)
    assert costed.take() == round((1_000 + 20_000) / 0.8)


def test_the_policy_alone_charges_what_it_did_before_the_process_was_modelled() -> None:
    costed = CostedScheduler(Scripted(), CLOCKWORK_COST, devices=8)
    costed.on_request(request(1), 0)
    costed.refuse()
    assert costed.take() == CLOCKWORK_COST.request_ns
    assert FREE.process == ProcessCost() and FREE.frontend.free


def test_a_turn_lasts_its_events_then_its_pass_and_what_it_decided_leaves_at_the_end() -> None:
    loop = EventLoop()
    policy = Scripted()
    costed = CostedScheduler(policy, replace(POLICY, process=PROCESS), devices=2)
    core = ControllerCore(loop, costed)
    left: list[int] = []

    def plan() -> None:
        costed.schedule(loop.now_ns())
        core.send(lambda: left.append(loop.now_ns()))

    def take_in() -> None:
        costed.on_request(request(1), loop.now_ns())
        policy.next = decided(actions=1, answers=1)
        core.defer(plan)

    core.post(take_in)
    loop.run(until_ns=NS_PER_MS)
    turn = 1_000 + 20_000
    a_pass = 300 + 10 * 2 + 4_000 + 50 + 40_000 + 30_000
    assert left == [turn + a_pass]
    assert core.busy_ns == turn + a_pass


def test_negative_terms_and_a_whole_core_of_background_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative: action_ns"):
        ProcessCost(action_ns=-1)
    with pytest.raises(ValueError, match="below 1"):
        FrontendCost(background=1.0)
