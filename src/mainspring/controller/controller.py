"""The mechanism around a ``Scheduler``: it reads the clock, feeds the policy
requests and results, sends its actions to workers and answers clients.

It is clock- and transport-agnostic: the simulator hands it a virtual clock and
emulated devices, the live server a wall clock and network links.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, cast

from mainspring.protocol import Action, ActionResult, ActionStatus, Infer, Outcome, Request, Response
from mainspring.protocol.tensors import TensorSpec, sample_problem
from mainspring.scheduler.base import Membership, Scheduler
from mainspring.time import NO_LEDGER, NS_PER_S, Clock, CpuLedger

log = logging.getLogger(__name__)


class WorkerLink(Protocol):
    """Where the actions for one device go; ``inputs`` (one entry per request) only with ``send_inputs``."""

    def submit(self, action: Action) -> None: ...


class InputLink(Protocol):
    """A link that also carries each request's inputs with an ``Infer`` (a real worker)."""

    def submit(self, action: Action, inputs: list[object] | None = None) -> None: ...


class ControllerObserver(Protocol):
    """Sees everything that passes through the controller (logs, metrics, reports)."""

    def on_request(self, request: Request, now_ns: int) -> None: ...

    def on_action(self, action: Action, now_ns: int) -> None: ...

    def on_result(self, result: ActionResult, action: Action, now_ns: int) -> None: ...

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None: ...


class Observers:
    """Several observers as one (metrics and a log, say), called in order."""

    def __init__(self, *observers: ControllerObserver) -> None:
        self._all = observers

    def on_request(self, request: Request, now_ns: int) -> None:
        for observer in self._all:
            observer.on_request(request, now_ns)

    def on_action(self, action: Action, now_ns: int) -> None:
        for observer in self._all:
            observer.on_action(action, now_ns)

    def on_result(self, result: ActionResult, action: Action, now_ns: int) -> None:
        for observer in self._all:
            observer.on_result(result, action, now_ns)

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        for observer in self._all:
            observer.on_answer(request, response, now_ns)


AnswerSink = Callable[[Request, Response, object], None]
WakeupHook = Callable[[int], None]
Defer = Callable[[Callable[[], None]], object]  # runs the callback soon, after the events already due
OutputSpecs = Callable[[str], Sequence[TensorSpec] | None]  # a model's outputs by its key (None: unknown)
CLOCK_SLACK_NS = NS_PER_S  # a result's timing may stray this far past what the clocks allow (their sync's error)


class UnknownActionError(ValueError):
    """A result for an action this controller never sent (nor lost)."""


class Controller:
    """Glue between one scheduler, its workers and its clients."""

    def __init__(
        self,
        scheduler: Scheduler,
        clock: Clock,
        workers: Mapping[int, WorkerLink],
        answer: AnswerSink,
        request_wakeup: WakeupHook | None = None,
        observer: ControllerObserver | None = None,
        send_inputs: bool = False,
        defer: Defer | None = None,
        output_specs: OutputSpecs | None = None,
        ledger: CpuLedger = NO_LEDGER,
    ) -> None:
        """``defer``: when given, a request, a result or a wake-up runs no pass of its own; one pass,
        deferred through it, serves every event that arrived before it ran (a live event loop under
        load hands many events per turn; without ``defer`` every event gets its own pass, as the
        simulator needs for exactly reproducible runs). ``output_specs``: when given (a live controller,
        whose workers return tensors), every ``Infer`` result must carry one output per request, each
        exactly the model's outputs (``deliver``). ``ledger``: where this controller's CPU time is split by part
        (the policy, sending actions, checking results, answering, metrics)."""
        self._scheduler = scheduler
        self._clock = clock
        self._workers = workers
        self._answer = answer
        self._request_wakeup = request_wakeup
        self._observer = observer
        self._requests: dict[int, Request] = {}
        self._outputs: dict[int, object] = {}
        self._in_flight: dict[int, Action] = {}
        self._pending_wakeup_ns: int | None = None
        self._send_inputs = send_inputs
        self._lost_actions: set[int] = set()  # sent to a device that is gone: a late result is ignored
        self._defer = defer
        self._pass_deferred = False
        self._output_specs = output_specs
        self._malformed: dict[int, str] = {}  # request id -> why its action's result was refused
        self._policy_part = ledger.part("policy")
        self._send_part = ledger.part("send")
        self._results_part = ledger.part("results")
        self._answer_part = ledger.part("answer")
        self._metrics_part = ledger.part("metrics")

    @property
    def outstanding(self) -> int:
        """Requests received and not yet answered."""
        return len(self._requests)

    def submit(self, request: Request) -> None:
        if request.id in self._requests:
            raise ValueError(f"request id {request.id} is already outstanding")
        now = self._clock.now_ns()
        self._requests[request.id] = request
        if self._observer is not None:
            with self._metrics_part:
                self._observer.on_request(request, now)
        with self._policy_part:
            self._scheduler.on_request(request, now)
        self._pass_soon(now)

    def deliver(self, result: ActionResult) -> None:
        """A worker's result for an action this controller sent (``deliver_checked``)."""
        self.deliver_checked(result)

    def deliver_checked(self, result: ActionResult, source: str = "its worker") -> str | None:
        """A worker's result for an action this controller sent (``source`` names the sender). It is
        checked before anything else: a malformed one (``result_problem``) reaches the policy as a failed
        action, whose requests are answered ``BAD_RESULT``; returns why it was refused (the caller drops
        the sender), None for a sound result. ``UnknownActionError`` for an action never sent."""
        with self._results_part:
            return self._deliver_checked(result, source)

    def _deliver_checked(self, result: ActionResult, source: str) -> str | None:
        action = self._in_flight.get(result.action_id)
        if action is None:
            if result.action_id in self._lost_actions:
                self._lost_actions.discard(result.action_id)
                return None
            raise UnknownActionError(f"result for unknown action {result.action_id}")
        now = self._clock.now_ns()
        problem = self.result_problem(action, result, now)
        if problem is not None:
            reason = f"{source} sent a malformed result for {type(action).__name__} {action.action_id}: {problem}"
            result = ActionResult(action.action_id, action.device, ActionStatus.ERROR, message=reason)
            if isinstance(action, Infer):
                self._malformed.update(dict.fromkeys(action.request_ids, reason))
        del self._in_flight[result.action_id]
        if self._observer is not None:
            with self._metrics_part:
                self._observer.on_result(result, action, now)
        if result.ok and isinstance(action, Infer) and result.outputs is not None:
            for request_id, output in zip(action.request_ids, result.outputs, strict=True):
                self._outputs[request_id] = output
        with self._policy_part:
            self._scheduler.on_result(result, now)
        self._pass_soon(now)
        return problem

    def result_problem(self, action: Action, result: ActionResult, now_ns: int) -> str | None:
        """Why ``result`` cannot be the result of ``action``; None when it can. Checked: the device it
        came from; an OK result's timing (not ending in the future, not starting before its window);
        with ``output_specs``, an OK ``Infer``'s outputs: one per request, each the model's outputs (names,
        datatypes, one sample's shape), empty for the requests it reports failed or not run."""
        if result.device != action.device:
            return f"it came from device {result.device}, the action went to device {action.device}"
        if not result.ok:
            return None
        timing = result.timing
        if timing is None:
            return "an OK result without a timing"
        if not action.earliest_ns - CLOCK_SLACK_NS <= timing.begin_ns <= timing.end_ns <= now_ns + CLOCK_SLACK_NS:
            return f"timing {timing.begin_ns}-{timing.end_ns} ns lies outside the action's window and now"
        if self._output_specs is None or not isinstance(action, Infer):
            return None
        count = len(action.request_ids)
        outputs = result.outputs
        if outputs is None or len(outputs) != count:
            return f"{'no' if outputs is None else len(outputs)} outputs for a batch of {count} requests"
        skipped = set(result.failed or ()) | set(result.unchecked)
        if not skipped <= set(range(count)):
            return f"it reports batch positions {sorted(skipped - set(range(count)))} of a batch of {count}"
        specs = self._output_specs(action.model)
        for index, output in enumerate(outputs):
            if index in skipped:
                continue
            problem = None if specs is None else sample_problem(specs, output)
            if problem is not None:
                return f"request {index} of the batch: {problem}"
        return None

    def wake(self) -> None:
        """Called at (or after) a time the scheduler asked to be woken."""
        now = self._clock.now_ns()
        if self._pending_wakeup_ns is not None and self._pending_wakeup_ns <= now:
            self._pending_wakeup_ns = None
        self._pass_soon(now)

    def overdue_devices(self, now_ns: int, grace_ns: int) -> dict[int, Action]:
        """Devices with an action whose result is overdue: not back by its latest start plus twice its
        expected duration plus ``grace_ns`` (one such action per device)."""
        return {
            action.device: action
            for action in self._in_flight.values()
            if now_ns > action.latest_ns + 2 * action.expected_duration_ns + grace_ns
        }

    def remove_device(self, device: int) -> None:
        """The device is gone: forget its in-flight actions and let the policy reschedule their requests."""
        if not isinstance(self._scheduler, Membership):
            raise TypeError(f"policy {type(self._scheduler).__name__} cannot lose a device")
        now = self._clock.now_ns()
        for action_id in [a for a, action in self._in_flight.items() if action.device == device]:
            del self._in_flight[action_id]
            self._lost_actions.add(action_id)
        self._scheduler.remove_device(device, now)
        self._pump(now)

    def pump(self) -> None:
        """Run a scheduling pass now (after the policy's membership changed)."""
        self._pump(self._clock.now_ns())

    def shutdown(self, reason: str, outcome: Outcome = Outcome.SHUTTING_DOWN) -> int:
        """Answer every outstanding request with an error; returns how many there were."""
        now = self._clock.now_ns()
        pending = list(self._requests)
        for request_id in pending:
            self._respond(Response(request_id, outcome, reason), now)
        return len(pending)

    def _pass_soon(self, now: int) -> None:
        if self._defer is None:
            self._pump(now)
        elif not self._pass_deferred:
            self._pass_deferred = True
            self._defer(self._deferred_pass)

    def _deferred_pass(self) -> None:
        self._pass_deferred = False
        self._pump(self._clock.now_ns())

    def _pump(self, now: int) -> None:
        with self._policy_part:  # the pass, less the sends, answers and metrics it leads to
            self._pump_now(now)

    def _pump_now(self, now: int) -> None:
        decisions = self._scheduler.schedule(now)
        unsent: list[ActionResult] = []
        for action in decisions.actions:
            self._in_flight[action.action_id] = action
            if self._observer is not None:
                with self._metrics_part:
                    self._observer.on_action(action, now)
            try:
                with self._send_part:
                    self._send(action)
            except Exception as error:  # one action its link cannot carry must not lose the rest of the pass
                log.exception("could not send action %d to device %d", action.action_id, action.device)
                message = f"the controller could not send the action to its worker: {error!r}"
                unsent.append(ActionResult(action.action_id, action.device, ActionStatus.ERROR, message=message))
        for response in decisions.responses:
            self._respond(response, now)
        wakeup = decisions.wakeup_ns
        if wakeup is not None and self._request_wakeup is not None:
            wakeup = max(wakeup, now)
            if self._pending_wakeup_ns is None or wakeup < self._pending_wakeup_ns:
                self._pending_wakeup_ns = wakeup
                self._request_wakeup(wakeup)
        for result in unsent:  # the policy hears of it as of any failed action, and answers its requests
            self.deliver(result)

    def _send(self, action: Action) -> None:
        link = self._workers[action.device]
        if self._send_inputs and isinstance(action, Infer):
            inputs = [self._requests[r].inputs for r in action.request_ids]
            cast("InputLink", link).submit(action, inputs)
        else:
            link.submit(action)

    def _respond(self, response: Response, now: int) -> None:
        request = self._requests.pop(response.request_id, None)
        if request is None:
            raise RuntimeError(f"policy answered request {response.request_id} twice or never received it")
        output = self._outputs.pop(response.request_id, None)
        malformed = self._malformed.pop(response.request_id, None)
        if malformed is not None and response.outcome is Outcome.INFERENCE_FAILED:  # the policy's word for any failure
            response = Response(response.request_id, Outcome.BAD_RESULT, malformed, response.action_id)
        if self._observer is not None:
            with self._metrics_part:
                self._observer.on_answer(request, response, now)
        with self._answer_part:
            self._answer(request, response, output)
