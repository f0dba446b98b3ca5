"""The Clockwork policy: predict, plan ahead, reject early.

Pure: it never reads the clock (``now_ns`` is passed in), does no I/O, and its only
randomness would come from the injected generator. A request is admitted or rejected at
arrival (``Admission``) and queued per model (``RequestQueues``). One pass of ``schedule``:
``_expire`` (reject what can no longer make it), ``_plan_infers`` on each device whose exec
lane frees within the horizon (which batch runs next is ``BatchPlanner``'s choice, cut where
``TightClassGuard`` keeps a device responsive for a tighter class), the strand
check (``StrandCheck``: requests stuck behind other models ask for a replica), then
``LoadPlanner.plan`` for models that need a device. Where weights are, and which results are
stale, is ``Residency``'s business.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mainspring.models.profile import ModelProfile
from mainspring.protocol import (
    Action,
    ActionResult,
    ActionStatus,
    DeviceSpec,
    EvictWeights,
    Infer,
    LoadWeights,
    Outcome,
    Request,
)
from mainspring.protocol.model_names import client_name
from mainspring.scheduler.base import Decisions, Forecast
from mainspring.scheduler.clockwork.admission import Admission
from mainspring.scheduler.clockwork.batching import BatchPlanner, Choice
from mainspring.scheduler.clockwork.config import ClockworkConfig
from mainspring.scheduler.clockwork.due import always
from mainspring.scheduler.clockwork.evictions import Evictions
from mainspring.scheduler.clockwork.forecast import lane_forecast
from mainspring.scheduler.clockwork.guard import NoTightClassGuard, TightClassGuard
from mainspring.scheduler.clockwork.loads import LoadPlanner
from mainspring.scheduler.clockwork.state import PolicyState
from mainspring.scheduler.clockwork.strands import StrandCheck
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.common import PolicyBookkeeping
from mainspring.scheduler.estimator import STALE_FACTOR
from mainspring.scheduler.lanes import NEVER
from mainspring.time import NS_PER_S, ms_to_ns

EVICT_WINDOW_NS = 3600 * NS_PER_S  # an eviction is safe whenever it runs
NO_GENERATION = 0  # evictions: their results change nothing


@dataclass(slots=True)
class _Flight:
    action: Action
    requests: list[Request]
    generation: int  # the model's residency the action was planned for
    probe: bool = False  # run against the estimates: its measurement replaces them


def _load_busy(device: DeviceState) -> bool:
    return device.load_lane.busy


class ClockworkScheduler(PolicyBookkeeping):
    """Predictive, SLO-aware scheduling of many models on many devices."""

    def __init__(
        self,
        profiles: Mapping[str, ModelProfile],
        devices: Sequence[DeviceSpec],
        config: ClockworkConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(profiles)
        self.config = config = config or ClockworkConfig()
        self.rng = rng or random.Random(0)
        self.state = state = PolicyState(self.profiles, devices, config, self.pages_of)
        self.estimator, self.shapes, self.judged = state.estimator, state.shapes, state.judged
        self.residency, self.queues = state.residency, state.queues
        evictions = Evictions(state)
        self.admission = Admission(state, evictions)
        self.guard = TightClassGuard(state) if config.guard_tight else NoTightClassGuard()
        if state.demand.by_cost is not None:
            state.demand.by_cost.follow_guard(lambda now_ns: self.guard.plan(now_ns).tight)
        self.loads = LoadPlanner(state, evictions, self.guard)
        self.batches = BatchPlanner(state)
        self.strands = StrandCheck(state)
        self.estimator.watch(self.strands.estimates_changed)
        self.horizon_ns = config.horizon_ns
        self._slack_ns = config.window_slack_ns
        self._in_flight: dict[int, _Flight] = {}
        self._measured_ns: dict[str, int] = {}  # per model: its smallest batch's last measurement or probe
        self._probes: list[Infer] = []  # issued by ``on_request``, handed out by the next ``schedule``
        self._gather_until = NEVER  # this pass: the first moment a device stops waiting to fill a batch
        self._hold_weightless()

    # --- the contract ------------------------------------------------------------
    def on_request(self, request: Request, now_ns: int) -> None:
        if self._refuse_unservable(request, (d.spec for d in self.residency.devices)):
            return
        self.guard.saw(request.model, request.slo_ns)
        self.estimator.expire(now_ns)
        model = request.model
        if self.config.demand_counts_rejected:
            self.state.demand.record(model, request.slo_ns, now_ns)
        refusal = self.admission.rejection(request, now_ns)
        if refusal is None:
            if not self.config.demand_counts_rejected:
                self.state.demand.record(model, request.slo_ns, now_ns)
            self.state.enqueue(request)
            return
        if not refusal.overloaded and self._probe(request, now_ns):
            return
        self._answer(request, Outcome.OVERLOADED if refusal.overloaded else Outcome.DEADLINE_AT_ARRIVAL, refusal.reason)
        if model not in self.residency.holders and not refusal.overloaded:
            self.loads.turned_away.add(model)  # load it anyway, so that later requests can be served

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        flight = self._in_flight.pop(result.action_id)
        action = flight.action
        device = self.residency.device(action.device)
        anchor = result.timing.end_ns if result.timing is not None else now_ns
        lane = device.exec_lane if isinstance(action, Infer) else device.load_lane
        lane.complete(action.action_id, anchor)
        current = action.model in self.profiles and self.residency.is_current(device, action.model, flight.generation)
        if isinstance(action, Infer):
            if current:
                device.unpin(action.model)
            self._infer_done(action, flight.requests, result, device, current, flight.probe)
        elif isinstance(action, LoadWeights) and current:
            device.unpin(action.model)
            self._load_done(action, result, device)

    def schedule(self, now_ns: int) -> Decisions:
        decisions = Decisions()
        decisions.actions.extend(a for a in self._probes if a.action_id in self._in_flight)  # not lost meanwhile
        self._probes.clear()
        self._expire(now_ns)
        self.estimator.expire(now_ns)
        self._gather_until = NEVER
        limit = now_ns + self.horizon_ns
        for device in self.residency.exec_due.due(limit):
            if device.waiting and device.exec_lane.free_ns <= limit:  # planning another may have closed its queues
                self._plan_infers(device, now_ns, decisions)
        self.strands.take_changes(now_ns)
        if self.config.spill_after is not None:
            self.strands.spill(now_ns, self.config.spill_after)
        if self.loads.wanted:
            for device, model, victims in self.loads.plan(now_ns):
                self._issue_load(device, model, victims, now_ns, decisions)
        decisions.responses = self._take_responses()
        decisions.wakeup_ns = self._next_wakeup(now_ns)
        return decisions

    # --- membership (devices and models that come and go) ------------------------------
    def add_device(self, spec: DeviceSpec) -> None:
        self.residency.add_device(spec)
        self.guard.reset()
        device = self.residency.device(spec.device)
        for model, pages in self.adoptable(spec):
            self.residency.hold(device, model, 0, pages)  # usable now; least recently used

    def _hold_everywhere(self, model: str) -> None:
        for device in self.residency.devices:
            self.residency.hold(device, model, 0, 0)

    def remove_device(self, device: int, now_ns: int) -> None:
        self.guard.reset()
        gone = self.residency.device(device)
        self.residency.remove_device(device, {m: self.state.pages_on(m, gone) for m in gone.ready_ns})
        lost: list[Request] = []
        for action_id, flight in list(self._in_flight.items()):
            if flight.action.device == device:
                del self._in_flight[action_id]
                lost += flight.requests
        if not self.residency.devices:
            self._answer_everything(Outcome.NO_WORKER, "no worker is connected")
        for request in lost:
            if not self.residency.devices:
                self._answer(request, Outcome.NO_WORKER, "no worker is connected")
            elif request.model in self.profiles and (
                now_ns + self.state.fastest_anywhere(request.model) <= request.ready_by_ns
            ):
                self.state.enqueue(request)
            else:
                reason = f"worker of device {device} was lost; the deadline cannot be met"
                self._answer(request, Outcome.WORKER_LOST, reason)

    def forecast(self, models: Iterable[str], now_ns: int) -> Forecast:
        """When a batch of one of each model would end here, from the lanes as booked (a read)."""
        return lane_forecast(self.residency, self.shapes, models, now_ns)

    def warm(self, model: str) -> bool:
        """Load ``model`` on a device with room before any request asks for it (a cell that is to take a
        model over); False when it is held already or unknown."""
        if model not in self.profiles or self.residency.holders.get(model):
            return False
        self.loads.turned_away.add(model)
        return True

    def remove_model(self, model: str, now_ns: int) -> None:
        reason = f"model {client_name(model)!r} was unloaded"
        for request in self.queues.take_all(model):
            self._answer(request, Outcome.MODEL_UNLOADED, reason)
        self.state.close_if_empty(model)
        for flight in self._in_flight.values():
            if flight.action.model == model and isinstance(flight.action, Infer):
                for request in flight.requests:
                    self._answer(request, Outcome.MODEL_UNLOADED, reason)
                flight.requests = []
        for device in self.residency.devices:
            self.residency.release(device, model, self.state.pages_on(model, device))
        for part in (self.loads, self.state.demand, self.shapes, self.judged, self.estimator):  # judged may be shapes
            part.forget(model)
        self.guard.forget(model)
        self._measured_ns.pop(model, None)
        self._forget_model(model)

    def _answer_everything(self, outcome: Outcome, reason: str) -> None:
        for model in self.queues.models():
            for request in self.queues.take_all(model):
                self._answer(request, outcome, reason)
            self.state.close_if_empty(model)
        for flight in self._in_flight.values():
            for request in flight.requests:
                self._answer(request, outcome, reason)
            flight.requests = []

    # --- queues ---------------------------------------------------------------------------
    def _expire(self, now_ns: int) -> None:
        """Reject queued requests that no device could now finish in time."""
        for request in self.queues.expired(now_ns):
            self.state.give_up(request, now_ns)
            self.state.close_if_empty(request.model)
        self._answer_given_up()

    def _answer_given_up(self) -> None:
        """Answer the requests the state gave up on (``PolicyState.give_up``), in that order: before any
        later answer, so the responses keep the order they were decided in."""
        for request in self.state.take_given_up():
            self._answer(request, Outcome.EXPIRED_IN_QUEUE, "deadline can no longer be met")

    # --- inference planning -----------------------------------------------------------
    def _plan_infers(self, device: DeviceState, now_ns: int, decisions: Decisions) -> None:
        """Fill the exec lane up to the horizon with the least-slack feasible batches."""
        limit = now_ns + self.horizon_ns
        while device.waiting:
            lane_start = max(now_ns, device.exec_lane.free_ns)
            if lane_start > limit:
                return
            if device.loading and device.waiting <= device.loading:
                return  # each is planned when its load reports (``BatchPlanner.best_batch``); due every pass till then
            choices = self.batches.weigh(device, lane_start, now_ns)
            self._answer_given_up()  # heads no holder could serve any more (``PolicyState.feasible_head``)
            if not choices:
                return
            chosen = min(choices)
            if len(choices) > 1:
                chosen = self.batches.trade_off(device, chosen, choices, now_ns)
            else:  # with others waiting, the lane's idle time would be theirs as well
                gather_until = self.batches.gather_until(device, chosen, now_ns)
                if gather_until is not None:
                    self._gather_until = min(self._gather_until, gather_until)
                    return
            allowed, wake_ns = self.guard.allow(device, chosen, choices, now_ns, self.batches)
            self._gather_until = min(self._gather_until, wake_ns)
            if allowed is None:
                return
            chosen = allowed
            self._issue_infer(device, chosen, now_ns, decisions)

    def _issue_infer(self, device: DeviceState, choice: Choice, now_ns: int, decisions: Decisions) -> None:
        model, start = choice.model, choice.start_ns
        queue = self.queues[model]
        passed_over = [queue.pop() for _ in range(choice.skip)]
        batch = [queue.pop() for _ in range(choice.n_requests)]
        for request in passed_over:
            queue.push(request)
        expected = self.shapes.exec_ns(model, choice.batch_size, device.kind)
        latest = min(min(r.ready_by_ns for r in batch) - expected, start + self._slack_ns)
        earliest = now_ns if self.config.start_early else start
        action = self._dispatch_infer(device, batch, choice.batch_size, (earliest, start, latest), expected, now_ns)
        decisions.actions.append(action)
        self.state.close_if_empty(model)

    def _dispatch_infer(
        self,
        device: DeviceState,
        batch: list[Request],
        batch_size: int,
        window: tuple[int, int, int],  # earliest start, planned start, latest start (ns)
        expected_ns: int,
        now_ns: int,
        probe: bool = False,
    ) -> Infer:
        """The Infer for ``batch`` on ``device``, booked on its exec lane and tracked until its result."""
        earliest, start, latest = window
        model = batch[0].model
        action = Infer(
            action_id=self._new_action_id(),
            device=device.spec.device,
            model=model,
            earliest_ns=earliest,
            latest_ns=latest,
            expected_duration_ns=expected_ns,
            request_ids=tuple(r.id for r in batch),
            batch_size=batch_size,
            deadlines_ns=tuple(r.ready_by_ns for r in batch),
        )
        device.exec_lane.plan(action.action_id, start, expected_ns)
        device.pin(model)
        device.touch(model, now_ns)
        self._in_flight[action.action_id] = _Flight(action, batch, device.generation[model], probe)
        return action

    def _probe(self, request: Request, now_ns: int) -> bool:
        """Run ``request`` at once, against the estimates, when an idle holder refuses it by them and
        the model has not been measured for ``probe_after_ms``, if the model was never measured (the
        figure is its profile, perhaps taken while the machine was busy) or its estimate lies far
        above its profile (a stale stall): a model its estimates refuse is never measured again to
        correct them. The probe's measurement replaces them (``_infer_done``)."""
        after, model = self.config.probe_after_ms, request.model
        last = self._measured_ns.get(model)
        if after is None or (last is not None and now_ns - last < ms_to_ns(after)):
            return False  # measured lately: the estimate is evidence, not a stale figure
        profiled = min(self.profiles[model].exec_ns.values())
        if now_ns + profiled / STALE_FACTOR > request.ready_by_ns:
            return False  # not even a profile taken on a busy machine could be that far off: it would answer late
        idle = [
            d
            for d in self.residency.holding(model)
            if not d.waiting and max(d.exec_lane.free_ns, d.ready_ns[model]) <= now_ns and model not in d.loading
        ]
        if not idle:
            return False
        device = idle[0]
        if last is not None and self.shapes.fastest_ns(model, device.kind) <= STALE_FACTOR * profiled:
            return False  # measured, and near the profile: the model is that slow (probes would only answer late)
        self._measured_ns[model] = now_ns
        size = self.shapes.sizes(model)[0]
        expected = self.shapes.exec_ns(model, size, device.kind)
        window = (now_ns, now_ns, now_ns + self._slack_ns)
        self._probes.append(self._dispatch_infer(device, [request], size, window, expected, now_ns, probe=True))
        return True

    # --- results ---------------------------------------------------------------------
    def _infer_done(
        self,
        action: Infer,
        batch: list[Request],
        result: ActionResult,
        device: DeviceState,
        current: bool,
        probe: bool,
    ) -> None:
        if result.ok:
            assert result.timing is not None
            if current and not result.isolated:  # isolating a failed input ran the batch again: not a measurement
                timing = result.timing
                observe = self.estimator.restart_exec if probe else self.estimator.observe_exec
                observe(action.model, action.batch_size, device.kind, timing.duration_ns, timing.end_ns)
                if action.batch_size == self.shapes.sizes(action.model)[0]:  # the size a probe would run
                    self._measured_ns[action.model] = max(self._measured_ns.get(action.model, 0), timing.end_ns)
            device.served.add(len(batch), result.timing.end_ns)
            self._answer_served(batch, result, action.action_id)
            return
        if result.status is ActionStatus.ERROR:
            for request in batch:
                self._answer(request, Outcome.INFERENCE_FAILED, f"inference failed: {result.message}")
            return
        if result.status is ActionStatus.NOT_RESIDENT and current:
            pages = self.state.pages_on(action.model, device)
            self.residency.release(device, action.model, pages)  # believe the worker
        for request in batch:  # refused: back to the queue; expiry rejects what cannot make it
            self.state.enqueue(request)

    def _load_done(self, action: LoadWeights, result: ActionResult, device: DeviceState) -> None:
        model = action.model
        if result.ok:
            assert result.timing is not None
            self.estimator.observe_load(model, device.kind, result.timing.duration_ns, result.timing.end_ns)
            self.residency.loaded(device, model, result.timing.end_ns)
            return
        self.residency.release(device, model, self.state.pages_on(model, device))
        if result.status is ActionStatus.ERROR and model not in self.residency.holders and model in self.queues:
            for request in self.queues.take_all(model):
                self._answer(request, Outcome.LOAD_FAILED, f"loading {client_name(model)} failed: {result.message}")
            self.state.close_if_empty(model)

    # --- loads (planned by ``LoadPlanner``) ---------------------------------------------------
    def _issue_load(
        self, device: DeviceState, model: str, victims: list[str], now_ns: int, decisions: Decisions
    ) -> None:
        start = max(now_ns, device.load_lane.free_ns)
        for victim in victims:
            self.residency.release(device, victim, self.state.pages_on(victim, device))
            evict = EvictWeights(
                action_id=self._new_action_id(),
                device=device.spec.device,
                model=victim,
                earliest_ns=start,
                latest_ns=start + EVICT_WINDOW_NS,
                expected_duration_ns=0,
            )
            device.load_lane.plan(evict.action_id, start, 0)
            self._in_flight[evict.action_id] = _Flight(evict, [], NO_GENERATION)
            decisions.actions.append(evict)
        expected = self.estimator.load_ns(model, device.kind)
        load = LoadWeights(
            action_id=self._new_action_id(),
            device=device.spec.device,
            model=model,
            earliest_ns=start,
            latest_ns=start + self._slack_ns,
            expected_duration_ns=expected,
        )
        ready = device.load_lane.plan(load.action_id, start, expected)
        pages = self.state.pages_on(model, device)
        generation = self.residency.hold(device, model, ready, pages)
        if device.free_pages < pages:  # the next such load needs an eviction
            self.state.demand.pool_filled()
        self.loads.turned_away.discard(model)
        device.loading.add(model)
        device.pin(model)
        self._in_flight[load.action_id] = _Flight(load, [], generation)
        decisions.actions.append(load)

    # --- helpers ---------------------------------------------------------------------------
    def _next_wakeup(self, now_ns: int) -> int | None:
        """The earliest future time something is due: an expiry, or a lane freeing within the horizon."""
        expiry = self.queues.next_expiry_ns()
        best = expiry if expiry is not None and expiry > now_ns else NEVER
        best = min(best, self._gather_until)
        after = now_ns + self.horizon_ns  # lanes due later than this wake the policy
        lanes = [self.residency.exec_due.next_after(after, always)]
        if self.loads.wanted:
            lanes.append(self.residency.load_due.next_after(after, _load_busy))
        for free_ns in lanes:
            if free_ns < best + self.horizon_ns:
                best = free_ns - self.horizon_ns
        return None if best == NEVER else best
