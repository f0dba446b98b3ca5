"""The controller with a hand-driven policy: it routes, answers once and wakes on request."""

import pytest

from mainspring.controller import Controller
from mainspring.protocol import ActionResult, ActionStatus, Infer, Outcome, Request, Response, ResponseStatus, Timing
from mainspring.scheduler.base import Decisions
from mainspring.time import ManualClock
from tests.fakes import ActionInbox, ScriptedScheduler


class Answers:
    def __init__(self) -> None:
        self.got: list[tuple[int, ResponseStatus, object]] = []

    def __call__(self, request: Request, response: Response, output: object) -> None:
        self.got.append((request.id, response.status, output))


def setup() -> tuple[ManualClock, ScriptedScheduler, dict[int, ActionInbox], Answers, list[int], Controller]:
    clock = ManualClock(1_000)
    policy = ScriptedScheduler()
    inboxes = {0: ActionInbox(), 1: ActionInbox()}
    answers = Answers()
    wakeups: list[int] = []
    controller = Controller(policy, clock, inboxes, answers, wakeups.append)
    return clock, policy, inboxes, answers, wakeups, controller


def test_actions_go_to_their_device_and_outputs_reach_the_answer() -> None:
    clock, policy, inboxes, answers, _, controller = setup()
    infer = Infer(7, 1, "m", 1_000, 2_000, 50, (1, 2), 2)
    policy.next = Decisions(actions=[infer])
    controller.submit(Request(1, "m", 1_000, 5_000, 4_000))
    controller.submit(Request(2, "m", 1_000, 5_000, 4_000))
    assert inboxes[1].actions == [infer] and inboxes[0].actions == []
    clock.advance(100)
    policy.next = Decisions(responses=[Response(2, Outcome.SERVED, action_id=7)])
    controller.deliver(ActionResult(7, 1, ActionStatus.OK, Timing(1_000, 1_050), outputs=["out-1", "out-2"]))
    assert policy.results[0].action_id == 7 and policy.requests[0].id == 1
    assert answers.got == [(2, ResponseStatus.SUCCESS, "out-2")]
    assert controller.outstanding == 1


def test_a_second_answer_to_one_request_is_a_policy_bug() -> None:
    _, policy, _, _, _, controller = setup()
    controller.submit(Request(1, "m", 1_000, 5_000, 4_000))
    policy.next = Decisions(responses=[Response(1, Outcome.OVERLOADED), Response(1, Outcome.OVERLOADED)])
    with pytest.raises(RuntimeError, match="twice"):
        controller.wake()


def test_results_for_unknown_actions_and_duplicate_request_ids_are_refused() -> None:
    _, _, _, _, _, controller = setup()
    with pytest.raises(ValueError, match="unknown action"):
        controller.deliver(ActionResult(99, 0, ActionStatus.OK))
    controller.submit(Request(1, "m", 1_000, 5_000, 4_000))
    with pytest.raises(ValueError, match="already outstanding"):
        controller.submit(Request(1, "m", 1_000, 5_000, 4_000))


def test_wakeups_are_requested_once_per_earlier_time() -> None:
    clock, policy, _, _, wakeups, controller = setup()
    policy.next = Decisions(wakeup_ns=5_000)
    controller.wake()
    policy.next = Decisions(wakeup_ns=6_000)  # later than the pending one: not requested again
    controller.wake()
    policy.next = Decisions(wakeup_ns=4_000)
    controller.wake()
    clock.set(4_000)
    controller.wake()
    policy.next = Decisions(wakeup_ns=5_000)
    controller.wake()
    assert wakeups == [5_000, 4_000, 5_000]


def test_shutdown_answers_everything_outstanding_with_an_error() -> None:
    _, _, _, answers, _, controller = setup()
    for i in range(3):
        controller.submit(Request(i, "m", 1_000, 5_000, 4_000))
    assert controller.shutdown("stopping") == 3
    assert sorted(a[0] for a in answers.got) == [0, 1, 2]
    assert {a[1] for a in answers.got} == {ResponseStatus.ERROR}
    assert controller.outstanding == 0
