"""The controller with a hand-driven policy: it routes, answers once and wakes on request."""

import pytest

from mainspring.controller import Controller
from mainspring.protocol import (
    Action,
    ActionResult,
    ActionStatus,
    DeviceSpec,
    Infer,
    LoadWeights,
    Outcome,
    Request,
    Response,
    ResponseStatus,
    Timing,
)
from mainspring.scheduler.base import Decisions
from mainspring.scheduler.clockwork import ClockworkScheduler
from mainspring.time import NS_PER_MS, ManualClock
from tests.fakes import PAGE, ActionInbox, ScriptedScheduler, profile, request


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
    controller.submit(Request.arriving(1, "m", 1_000, 4_000, 0))
    controller.submit(Request.arriving(2, "m", 1_000, 4_000, 0))
    assert inboxes[1].actions == [infer] and inboxes[0].actions == []
    clock.advance(100)
    policy.next = Decisions(responses=[Response(2, Outcome.SERVED, action_id=7)])
    controller.deliver(ActionResult(7, 1, ActionStatus.OK, Timing(1_000, 1_050), outputs=["out-1", "out-2"]))
    assert policy.results[0].action_id == 7 and policy.requests[0].id == 1
    assert answers.got == [(2, ResponseStatus.SUCCESS, "out-2")]
    assert controller.outstanding == 1


def test_a_second_answer_to_one_request_is_a_policy_bug() -> None:
    _, policy, _, _, _, controller = setup()
    controller.submit(Request.arriving(1, "m", 1_000, 4_000, 0))
    policy.next = Decisions(responses=[Response(1, Outcome.OVERLOADED), Response(1, Outcome.OVERLOADED)])
    with pytest.raises(RuntimeError, match="twice"):
        controller.wake()


def test_results_for_unknown_actions_and_duplicate_request_ids_are_refused() -> None:
    _, _, _, _, _, controller = setup()
    with pytest.raises(ValueError, match="unknown action"):
        controller.deliver(ActionResult(99, 0, ActionStatus.OK))
    controller.submit(Request.arriving(1, "m", 1_000, 4_000, 0))
    with pytest.raises(ValueError, match="already outstanding"):
        controller.submit(Request.arriving(1, "m", 1_000, 4_000, 0))


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
        controller.submit(Request.arriving(i, "m", 1_000, 4_000, 0))
    assert controller.shutdown("stopping") == 3
    assert sorted(a[0] for a in answers.got) == [0, 1, 2]
    assert {a[1] for a in answers.got} == {ResponseStatus.ERROR}
    assert controller.outstanding == 0


class CannotCarry(ActionInbox):
    """A link that fails to send the actions of one kind, as an encoder can (an overflowing field)."""

    def __init__(self, kind: type[Action]) -> None:
        super().__init__()
        self._kind = kind

    def submit(self, action: Action) -> None:
        if isinstance(action, self._kind):
            raise OverflowError("int too big to convert")
        super().submit(action)


def test_an_action_its_link_cannot_send_fails_alone_and_the_rest_of_the_pass_goes_out() -> None:
    clock, policy, _, answers, _, _ = setup()
    inboxes = {0: CannotCarry(Infer), 1: ActionInbox()}
    controller = Controller(policy, clock, inboxes, answers)
    for i in (1, 2, 3):
        controller.submit(Request.arriving(i, "m", 1_000, 4_000, 0))
    unsendable, fine = Infer(7, 0, "m", 1_000, 2_000, 50, (1,), 1), Infer(8, 1, "m", 1_000, 2_000, 50, (2,), 1)
    policy.next = Decisions(actions=[unsendable, fine], responses=[Response(3, Outcome.OVERLOADED)])
    controller.wake()
    assert inboxes[1].actions == [fine]
    assert [a[0] for a in answers.got] == [3]
    (failed,) = policy.results  # told as a failed action, so the policy answers request 1
    assert failed.action_id == 7 and failed.status is ActionStatus.ERROR
    assert "could not send" in failed.message and "int too big" in failed.message
    controller.deliver(ActionResult(8, 1, ActionStatus.OK, Timing(1_000, 1_050), outputs=["out-2"]))  # still known


def test_with_the_clockwork_policy_a_request_whose_load_cannot_be_sent_is_answered_with_an_error() -> None:
    clock = ManualClock(0)
    policy = ClockworkScheduler({"a": profile("a")}, [DeviceSpec(0, "v100", 100 * PAGE, PAGE)])
    answers = Answers()
    controller = Controller(policy, clock, {0: CannotCarry(LoadWeights)}, answers)
    controller.submit(request(1, "a", 0))
    assert answers.got == [(1, ResponseStatus.ERROR, None)] and controller.outstanding == 0
    clock.advance(1 * NS_PER_MS)
    controller.submit(request(2, "a", clock.now_ns()))  # the controller goes on serving
    assert [a[0] for a in answers.got] == [1, 2]
