"""The Clockwork policy: predict, plan ahead, reject early.

Pure: it never reads the clock (``now_ns`` is passed in), does no I/O, and its only
randomness would come from the injected generator. A request is admitted or rejected at
arrival (``Admission``) and queued per model (``RequestQueues``). One pass of ``schedule``:
``_expire`` (reject what can no longer make it), ``_plan_infers`` on each device whose exec
lane frees within the horizon, then ``LoadPlanner.plan`` for models that need a device.
Where weights are, and which results are stale, is ``Residency``'s business.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mainspring.models.profile import ModelProfile
from mainspring.protocol import (
    CPU_KIND,
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
from mainspring.scheduler.base import Decisions
from mainspring.scheduler.clockwork.admission import Admission
from mainspring.scheduler.clockwork.config import ClockworkConfig
from mainspring.scheduler.clockwork.due import always
from mainspring.scheduler.clockwork.estimator import Estimator
from mainspring.scheduler.clockwork.loads import LoadPlanner
from mainspring.scheduler.clockwork.queues import ModelQueue, RequestQueues
from mainspring.scheduler.clockwork.residency import Residency
from mainspring.scheduler.clockwork.settled import SettledStrands
from mainspring.scheduler.clockwork.shapes import BatchShapes, cheapest_in, first_of_split
from mainspring.scheduler.clockwork.tracker import NEVER, DeviceState
from mainspring.scheduler.common import PolicyBookkeeping
from mainspring.time import NS_PER_S, ms_to_ns

EVICT_WINDOW_NS = 3600 * NS_PER_S  # an eviction is safe whenever it runs
NO_GENERATION = 0  # evictions: their results change nothing


SHEDDING_SHARE = 0.1  # a device is shedding load once this share of its recent requests expired in queue


class _Choice(NamedTuple):
    """A candidate batch; ordered by slack (the most urgent request's, after this batch)."""

    slack_ns: int
    model: str
    start_ns: int
    n_requests: int
    batch_size: int
    deadline_ns: int  # of its most urgent request
    skip: int = 0  # most urgent requests passed over (they stay queued; see ``_keep_backlog_whole``)

    @property
    def exec_ns(self) -> int:
        """The batch's estimate (its slack is what its deadline leaves after it)."""
        return self.deadline_ns - self.start_ns - self.slack_ns


_new_choice = tuple.__new__  # a _Choice from its fields' tuple, without the named tuple's Python-level __new__

# A refusing estimate this far above the model's profile is taken for a stale stall and probed.
STALE_OVER_PROFILE = 1.5


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
        max_age = None if config.estimate_max_age_s is None else ms_to_ns(config.estimate_max_age_s * 1000)
        window, percentile = config.estimate_window, config.estimate_percentile
        cpu = {CPU_KIND: config.estimate_percentile_cpu}
        self.estimator = Estimator(self.profiles, window, percentile, max_age_ns=max_age, kind_percentiles=cpu)
        self.shapes = BatchShapes(self.profiles, self.estimator, config.max_batch_size, config.monotone_estimates)
        self.residency = Residency(list(devices), ms_to_ns(config.rate_memory_ms))
        self.queues = RequestQueues()
        self.admission = Admission(config, self.residency, self.queues, self.shapes, self._idle_victims)
        self.loads = LoadPlanner(config, self.residency, self.queues, self.shapes, self.admission, self._pages_on)
        self.horizon_ns = config.horizon_ns
        self._slack_ns = config.window_slack_ns
        self._margin_ns = config.deadline_margin_ns
        self._in_flight: dict[int, _Flight] = {}
        self._stranded: set[str] = set()  # models whose oldest request waited past ``spill_after``
        self._active_strands: set[str] = set()  # of those, the ones to check (``_spill_the_stranded``)
        self._settled = SettledStrands()  # stranded models replicas on the way cover, until that could change
        self.estimator.watch(self._estimates_changed)
        self._measured_ns: dict[str, int] = {}  # per model: its smallest batch's last measurement or probe
        self._probes: list[Infer] = []  # issued by ``on_request``, handed out by the next ``schedule``

    # --- the contract ------------------------------------------------------------
    def on_request(self, request: Request, now_ns: int) -> None:
        if self._refuse_unservable(request, (d.spec for d in self.residency.devices)):
            return
        self.estimator.expire(now_ns)
        model = request.model
        if self.config.demand_counts_rejected:
            self.admission.record(model, now_ns)
        refusal = self.admission.rejection(request, now_ns)
        if refusal is None:
            if not self.config.demand_counts_rejected:
                self.admission.record(model, now_ns)
            self._enqueue(request)
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
        limit = now_ns + self.horizon_ns
        for device in self.residency.exec_due.due(limit):
            if device.waiting and device.exec_lane.free_ns <= limit:  # planning another may have closed its queues
                self._plan_infers(device, now_ns, decisions)
        self._take_changes(now_ns)
        if self.config.spill_after is not None:
            self._spill_the_stranded(now_ns, self.config.spill_after)
        if self.loads.wanted:
            self.loads.plan(now_ns, decisions, self._issue_load)
        decisions.responses = self._take_responses()
        decisions.wakeup_ns = self._next_wakeup(now_ns)
        return decisions

    # --- membership (devices and models that come and go) ------------------------------
    def add_device(self, spec: DeviceSpec) -> None:
        self.residency.add_device(spec)
        device = self.residency.device(spec.device)
        for model, pages in self.adoptable(spec):
            self.residency.hold(device, model, 0, pages)  # usable now; least recently used

    def remove_device(self, device: int, now_ns: int) -> None:
        gone = self.residency.device(device)
        self.residency.remove_device(device, {m: self._pages_on(m, gone) for m in gone.ready_ns})
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
            elif request.model in self.profiles and now_ns + self._fastest_anywhere(request.model) <= (
                request.deadline_ns - self._margin_ns
            ):
                self._enqueue(request)
            else:
                reason = f"worker of device {device} was lost; the deadline cannot be met"
                self._answer(request, Outcome.WORKER_LOST, reason)

    def remove_model(self, model: str, now_ns: int) -> None:
        reason = f"model {model!r} was unloaded"
        for request in self.queues.take_all(model):
            self._answer(request, Outcome.MODEL_UNLOADED, reason)
        self._close_if_empty(model)
        for flight in self._in_flight.values():
            if flight.action.model == model and isinstance(flight.action, Infer):
                for request in flight.requests:
                    self._answer(request, Outcome.MODEL_UNLOADED, reason)
                flight.requests = []
        for device in self.residency.devices:
            self.residency.release(device, model, self._pages_on(model, device))
        for part in (self.loads, self.admission, self.shapes, self.estimator):
            part.forget(model)
        self._measured_ns.pop(model, None)
        self._forget_model(model)

    def _answer_everything(self, outcome: Outcome, reason: str) -> None:
        for model in self.queues.models():
            for request in self.queues.take_all(model):
                self._answer(request, outcome, reason)
            self._close_if_empty(model)
        for flight in self._in_flight.values():
            for request in flight.requests:
                self._answer(request, outcome, reason)
            flight.requests = []

    # --- queues ---------------------------------------------------------------------------
    def _enqueue(self, request: Request) -> None:
        """Queue ``request`` until the last moment its fastest batch could start on any device."""
        expires = request.deadline_ns - self._margin_ns - self._fastest_anywhere(request.model) + 1
        after = self.config.spill_after
        strands = None if after is None else request.arrival_ns + int(after * request.slo_ns) + 1
        if self.queues.push(request, expires, strands):
            self.residency.queue_opened(request.model)

    def _expire(self, now_ns: int) -> None:
        """Reject queued requests that no device could now finish in time."""
        for request in self.queues.expired(now_ns):
            self._reject_expired(request, now_ns)
            self._close_if_empty(request.model)

    def _reject_expired(self, request: Request, now_ns: int) -> None:
        self._answer(request, Outcome.EXPIRED_IN_QUEUE, "deadline can no longer be met")
        holders = self.residency.holding(request.model)
        for device in holders:
            device.expired.add(1.0 / len(holders), now_ns)

    def _spill_the_stranded(self, now_ns: int, after: float) -> None:
        """A request that has waited ``after`` of its SLO behind other models' batches on a busy
        holder asks for a new replica: a device with an idle lane loads its model (if in time).
        Checked on every pass (every ``replication_check_ms`` instead raised the Azure x30 window
        from 2 to 1,196 misses), but only for models with such a request: a heap of strand times
        finds them, so the cost does not grow with the devices' waiting models."""
        stranded, active, settled = self._stranded, self._active_strands, self._settled
        needs_replica, cold = self.admission.needs_replica, self.residency.cold
        # Skipped until that changes: models waiting for their replica, cold ones (no holder to be
        # stranded behind; their load is planned anyway), and ones the replicas on the way cover.
        # ``active`` holds the rest (and some of those, dropped when reached; kept by ``_take_changes``):
        # taking the difference of the sets on every pass cost as much as the checks (hundreds of
        # parked models at 150 devices).
        for model in self.queues.newly_stranded(now_ns):
            stranded.add(model)
            active.add(model)
        for model in list(active):
            if model in needs_replica or model in cold or model in settled.models:
                active.discard(model)
                continue
            queue = self.queues.get(model)
            head = None if queue is None else queue.head()
            if queue is None or head is None or now_ns - head.arrival_ns <= after * head.slo_ns:
                stranded.discard(model)  # its stranded requests left; later ones have their own strand time
                active.discard(model)
                continue
            holders = self.residency.holding(model)
            if self._replicas_on_the_way_cover(model, queue, head, holders, now_ns):
                continue  # they may serve the stranded requests: not one more replica per pass
            if any(device.exec_lane.free_ns > now_ns for device in holders):
                needs_replica.add(model)

    def _replicas_on_the_way_cover(
        self, model: str, queue: ModelQueue, head: Request, holders: tuple[DeviceState, ...], now_ns: int
    ) -> bool:
        """Can the holders still loading ``model`` serve its whole queue, one batch each, by the head's
        deadline? A single stranded request needs one new replica, a burst of one model may need more.
        If so the model is set aside (``SettledStrands``) until the answer could change."""
        room, count = 0, queue.count  # a queue with a head holds at least one request
        counted: list[int] = []
        until = NEVER  # the answer holds while the clock is at or before every counted start
        for device in holders:
            if model in device.loading:
                free_ns = max(device.exec_lane.free_ns, device.ready_ns[model])
                room += self._largest_batch_by(model, device.kind, max(now_ns, free_ns), head.deadline_ns)
                counted.append(device.spec.device)
                until = min(until, free_ns)
                if room >= count:
                    if until >= now_ns:
                        self._settled.settle(model, until, tuple(counted))
                    return True
        return False

    def _take_changes(self, now_ns: int) -> None:
        """Hand what changed since the last pass to ``SettledStrands`` and to the strand check."""
        queues, residency, settled = self.queues, self.residency, self._settled
        if settled.models:
            settled.unsettle(queues.changed)
            settled.unsettle(residency.changed)
            settled.lanes_moved(residency.exec_moved)
            settled.expire(now_ns)
        queues.changed.clear()
        residency.changed.clear()
        residency.exec_moved.clear()
        # Stranded models that stopped waiting for a replica, stopped being cold or were set free
        # are checked again (``_spill_the_stranded``).
        for released in (self.admission.needs_replica.released, residency.cold.released, settled.released):
            if released:
                if self._stranded:
                    self._active_strands.update(released.intersection(self._stranded))
                released.clear()

    def _estimates_changed(self, kind: str, model: str | None) -> None:
        if model is None:
            self._settled.clear()  # the kind's ratio moved: every model's estimates may have
        else:
            self._settled.unsettle((model,))

    def _close_if_empty(self, model: str) -> None:
        if self.queues.close_if_empty(model):
            self.residency.queue_closed(model)
            self.loads.queue_closed(model)
            self.admission.needs_replica.discard(model)

    # --- inference planning -----------------------------------------------------------
    def _plan_infers(self, device: DeviceState, now_ns: int, decisions: Decisions) -> None:
        """Fill the exec lane up to the horizon with the least-slack feasible batches."""
        limit = now_ns + self.horizon_ns
        while device.waiting:
            lane_start = max(now_ns, device.exec_lane.free_ns)
            if lane_start > limit:
                return
            if device.loading and device.waiting <= device.loading:
                return  # each is planned when its load reports (``_best_batch``); due on every pass till then
            choices = self._weigh(device, lane_start, now_ns)
            if not choices:
                return
            chosen = min(choices)
            if len(choices) > 1:
                chosen = self._trade_off(device, chosen, choices, now_ns)
            self._issue_infer(device, chosen, now_ns, decisions)

    def _weigh(self, device: DeviceState, start_ns: int, now_ns: int) -> list[_Choice]:
        """Each waiting model's ``_best_batch`` here (those it finds), in model order (sorted: runs
        repeat across processes). This weighs every waiting model for every batch issued (a quarter
        of the policy's time at 32 devices), and most queues hold one request: with monotone
        estimates the smallest size is also the cheapest, so such a queue runs at that size if at
        all, read here from its estimate. The other queues go the general way."""
        choices = []
        loading, queues, margin = device.loading, self.queues, self._margin_ns
        kind = device.kind
        kept, estimates = self.shapes.of_kind(kind), self.shapes.estimates
        lone = self.config.monotone_estimates
        for model in sorted(device.waiting):
            if model in loading:
                continue  # planned when the load reports (``_best_batch``)
            queue = queues[model]
            head = queue.head() if lone and queue.count == 1 else None
            if head is None:
                choice = self._best_batch(device, model, start_ns, now_ns)
            else:
                size, exec_ns = (kept.get(model) or estimates(model, kind))[0][0]
                deadline = head.deadline_ns
                if deadline - margin - start_ns >= exec_ns:
                    fields = (deadline - start_ns - exec_ns, model, start_ns, 1, size, deadline, 0)
                    choices.append(_new_choice(_Choice, fields))
                    continue
                choice = self._best_batch_of_feasible(device, queue, head, start_ns, now_ns)  # none fits here
            if choice is not None:
                choices.append(choice)
        return choices

    def _best_batch(self, device: DeviceState, model: str, start_ns: int, now_ns: int) -> _Choice | None:
        """The largest batch of ``model`` that meets its most urgent deadline here, with its slack."""
        if model in device.loading:
            return None  # planned when the load reports: an infer must never race its own load
        queue = self.queues[model]
        head = queue.head()
        # A batch that fits here proves the head feasible (this device holds the model, ready by
        # ``start_ns``): only when none fits is it worth asking every holder (``_feasible_head``).
        choice = None if head is None else self._batch_within(device, queue, head, start_ns, head.deadline_ns)
        if choice is None:
            return self._best_batch_of_feasible(device, queue, head, start_ns, now_ns)
        if not self.config.whole_batches or self._whole(queue, choice):
            return choice
        return self._keep_backlog_whole(device, queue, start_ns, choice)

    def _best_batch_of_feasible(
        self, device: DeviceState, queue: ModelQueue, head: Request | None, start_ns: int, now_ns: int
    ) -> _Choice | None:
        """``_best_batch`` once no batch for the head fits here: for the most urgent request some holder can serve."""
        feasible = self._feasible_head(queue, now_ns)
        if feasible is None or feasible is head:
            return None
        choice = self._batch_within(device, queue, feasible, start_ns, feasible.deadline_ns)
        if self.config.whole_batches and choice is not None:
            choice = self._keep_backlog_whole(device, queue, start_ns, choice)
        return choice

    def _whole(self, queue: ModelQueue, choice: _Choice) -> bool:
        """Does ``choice`` take as much of the queue as one batch can?"""
        return choice.n_requests >= min(queue.count, self.shapes.sizes(queue.model)[-1])

    def _keep_backlog_whole(self, device: DeviceState, queue: ModelQueue, start_ns: int, choice: _Choice) -> _Choice:
        """Keep a backlog's batches whole. When the most urgent request only allows a part of the
        queue to run and the rest could not follow in time, serving it would leave every later
        batch of the model short (the collapse of deadline order under overload). Instead run the
        largest batch that fits from the first request whose deadline allows it; the requests
        passed over stay queued (another device may serve them) and expire if none can."""
        model = queue.model
        largest = self.shapes.sizes(model)[-1]
        if self._whole(queue, choice):
            return choice
        deadlines = sorted(r.deadline_ns for r in queue.requests())
        count, n = len(deadlines), choice.n_requests
        kind, margin = device.kind, self._margin_ns
        after = start_ns + self.shapes.exec_ns(model, choice.batch_size, kind)
        rest = self.shapes.padded(model, min(count - n, largest))
        if after + self.shapes.exec_ns(model, rest, kind) + margin <= deadlines[n]:
            return choice  # the rest can follow: nothing is lost by serving the head first
        if self._holders_take_rest(device, model, start_ns, after, count - n, deadlines[n]):
            return choice  # this device after the chosen batch and the other holders can take the rest
        for skip in range(1, count):
            size = self.shapes.padded(model, min(count - skip, largest))
            exec_ns = self.shapes.exec_ns(model, size, kind)
            if start_ns + exec_ns + margin <= deadlines[skip]:
                n_requests = min(count - skip, size)
                return _Choice(
                    deadlines[skip] - start_ns - exec_ns, model, start_ns, n_requests, size, deadlines[skip], skip
                )
        return choice

    def _holders_take_rest(
        self, device: DeviceState, model: str, start_ns: int, after_ns: int, rest: int, finish_by_ns: int
    ) -> bool:
        """Whether the model's holders, one batch each (``device`` from ``after_ns``), can serve ``rest``
        requests by ``finish_by_ns``.
        Room for one request is not enough: with many holders each would serve only its head, and
        a hot model's backlog would run in batches of one or two on every holder, the lanes full
        and the queue expiring (the Azure sample's x30 burst: 500-800 misses on 4 of 7 seeds)."""
        room = 0
        for other in self.residency.holding(model):
            free = after_ns if other is device else max(start_ns, other.exec_lane.free_ns, other.ready_ns[model])
            room += self._largest_batch_by(model, other.kind, free, finish_by_ns)
            if room >= rest:
                return True
        return False

    def _largest_batch_by(self, model: str, kind: str, start_ns: int, finish_by_ns: int) -> int:
        """The largest batch size of ``model`` that, started at ``start_ns``, ends (with the margin) by
        ``finish_by_ns``; 0 if none does."""
        for size, exec_ns in reversed(self.shapes.estimates(model, kind)[0]):
            if start_ns + exec_ns + self._margin_ns <= finish_by_ns:
                return size
        return 0

    def _batch_within(
        self, device: DeviceState, queue: ModelQueue, head: Request, start_ns: int, finish_by_ns: int
    ) -> _Choice | None:
        """The largest batch of ``queue``'s model starting at ``start_ns`` that ends (with the margin) by
        ``finish_by_ns``; ``head`` is the queue's most urgent request."""
        model, kind = queue.model, device.kind
        table, fastest = self.shapes.estimates(model, kind)
        latest_end = finish_by_ns - self._margin_ns - start_ns
        if latest_end < fastest:
            return None  # no size fits (the common answer on a booked lane)
        smallest = table[0][0]
        longest = self.config.max_batch_slo_fraction * head.slo_ns if len(device.waiting) > 1 else NEVER
        for size, exec_ns in reversed(table):
            if exec_ns <= latest_end and (exec_ns <= longest or size == smallest):
                count = min(queue.count, size)
                cheapest = cheapest_in(table, count, size)
                assert cheapest is not None  # ``size`` is one of the table's
                padded, padded_ns = cheapest
                if self.config.split_padding and padded > count:
                    padded, padded_ns = first_of_split(table, count, size)
                    count = min(count, padded)
                return _Choice(
                    head.deadline_ns - start_ns - padded_ns, model, start_ns, count, padded, head.deadline_ns
                )
        return None

    def _batch_within_head(self, device: DeviceState, model: str, start_ns: int, finish_by_ns: int) -> _Choice | None:
        """``_batch_within`` for ``model``'s queue and its head."""
        queue = self.queues[model]
        head = queue.head()
        return None if head is None else self._batch_within(device, queue, head, start_ns, finish_by_ns)

    def _trade_off(self, device: DeviceState, chosen: _Choice, choices: list[_Choice], now_ns: int) -> _Choice:
        """What to run instead of the least-slack batch, when the candidates cannot all be served.
        A model within its share keeps deadline order against models over theirs (isolation)."""
        over_share = self.admission.over_share
        chosen_over = over_share(chosen.model, device, now_ns)
        if (
            self.config.efficient_when_contended
            and device.shedding(now_ns, SHEDDING_SHARE)
            and (chosen_over or not any(over_share(c.model, device, now_ns) for c in choices))
        ):
            efficient = self._most_efficient_if_contended(device, chosen, choices)
            if efficient is not None:
                return efficient
        if self.config.lookahead and chosen_over:
            return self._spare_the_next(device, chosen, choices, now_ns)
        return chosen

    def _most_efficient_if_contended(
        self, device: DeviceState, chosen: _Choice, choices: list[_Choice]
    ) -> _Choice | None:
        """Past saturation lane time is what is scarce. Deadline order runs every batch at its
        deadline's edge, where only small batches fit and the leftovers become batches of one;
        so when the candidates, one batch each in deadline order, cannot all meet their deadlines,
        run the one that serves the most requests per unit of lane time (``docs/scheduler.md``)."""
        kind = device.kind
        duration = {c.model: c.exec_ns for c in choices}
        finish = chosen.start_ns
        for choice in sorted(choices):
            finish += duration[choice.model]
            if finish + self._margin_ns > choice.deadline_ns:
                return max(choices, key=lambda c: (self._efficiency(c, duration[c.model], kind), -c.slack_ns))
        return None  # deadline order serves them all: nothing to trade

    def _efficiency(self, choice: _Choice, duration_ns: int, kind: str) -> float:
        """The batch's throughput as a share of its model's best (full batches of the largest size):
        a slow model's full batch is as good a use of the lane as a fast model's."""
        largest = self.shapes.sizes(choice.model)[-1]
        best_per_request = self.shapes.exec_ns(choice.model, largest, kind) / largest
        return choice.n_requests * best_per_request / max(1, duration_ns)

    def _spare_the_next(self, device: DeviceState, chosen: _Choice, choices: list[_Choice], now_ns: int) -> _Choice:
        """One step of lookahead that Clockwork's bump lacks: if the least-slack batch would
        end too late for the next most urgent model, run that model first when the chosen
        one can afford the wait, else shrink the chosen batch so both make it."""
        kind = device.kind
        chosen_ns = chosen.exec_ns
        others = [c for c in choices if c.model != chosen.model]
        urgent = min(others, key=lambda c: c.deadline_ns - self.shapes.fastest_ns(c.model, kind))
        urgent_latest_start = urgent.deadline_ns - self._margin_ns - self.shapes.fastest_ns(urgent.model, kind)
        if chosen.start_ns + chosen_ns <= urgent_latest_start:
            return chosen
        if self.config.lookahead_within_share and self.admission.over_share(urgent.model, device, now_ns):
            return chosen  # lookahead protects models within their share, not one over-share model from another
        finish_by = min(urgent.deadline_ns, chosen.deadline_ns - self._margin_ns - chosen_ns)
        first = self._batch_within_head(device, urgent.model, urgent.start_ns, finish_by)
        if first is not None:
            return first
        smaller = self._batch_within_head(device, chosen.model, chosen.start_ns, urgent_latest_start + self._margin_ns)
        return smaller if smaller is not None and smaller.deadline_ns >= chosen.deadline_ns else chosen

    def _feasible_head(self, queue: ModelQueue, now_ns: int) -> Request | None:
        """The most urgent request that some holder can still serve; rejects the ones none can."""
        while True:
            head = queue.head()
            if head is None:
                self._close_if_empty(queue.model)
                return None
            if self._earliest_completion(queue.model, now_ns) + self._margin_ns <= head.deadline_ns:
                return head
            queue.pop()
            self._reject_expired(head, now_ns)

    def _earliest_completion(self, model: str, now_ns: int) -> int:
        """Best case over devices: on a holder as soon as its lane frees, else after a cold load."""
        best = NEVER
        kind, fastest = "", 0  # holders are mostly of one kind: estimate once per run of a kind
        for d in self.residency.holding(model):
            if d.kind != kind:
                kind, fastest = d.kind, self.shapes.fastest_ns(model, d.kind)
            best = min(best, max(now_ns, d.exec_lane.free_ns, d.ready_ns[model]) + fastest)
        if best == NEVER:
            for d in self.residency.devices:
                ready = max(now_ns, d.load_lane.free_ns) + self.estimator.load_ns(model, d.kind)
                best = min(best, max(ready, d.exec_lane.free_ns) + self.shapes.fastest_ns(model, d.kind))
        return best

    def _issue_infer(self, device: DeviceState, choice: _Choice, now_ns: int, decisions: Decisions) -> None:
        model, start = choice.model, choice.start_ns
        queue = self.queues[model]
        passed_over = [queue.pop() for _ in range(choice.skip)]
        batch = [queue.pop() for _ in range(choice.n_requests)]
        for request in passed_over:
            queue.push(request)
        expected = self.shapes.exec_ns(model, choice.batch_size, device.kind)
        latest = min(min(r.deadline_ns for r in batch) - self._margin_ns - expected, start + self._slack_ns)
        earliest = now_ns if self.config.start_early else start
        action = self._dispatch_infer(device, batch, choice.batch_size, (earliest, start, latest), expected, now_ns)
        decisions.actions.append(action)
        self._close_if_empty(model)

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
            deadlines_ns=tuple(r.deadline_ns - self._margin_ns for r in batch),  # the result must travel back
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
        if now_ns + profiled / STALE_OVER_PROFILE > request.deadline_ns - self._margin_ns:
            return False  # not even a profile taken on a busy machine could be that far off: it would answer late
        idle = [
            d
            for d in self.residency.holding(model)
            if not d.waiting and max(d.exec_lane.free_ns, d.ready_ns[model]) <= now_ns and model not in d.loading
        ]
        if not idle:
            return False
        device = idle[0]
        if last is not None and self.shapes.fastest_ns(model, device.kind) <= STALE_OVER_PROFILE * profiled:
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
            self.residency.release(device, action.model, self._pages_on(action.model, device))  # believe the worker
        for request in batch:  # refused: back to the queue; expiry rejects what cannot make it
            self._enqueue(request)

    def _load_done(self, action: LoadWeights, result: ActionResult, device: DeviceState) -> None:
        model = action.model
        if result.ok:
            assert result.timing is not None
            self.estimator.observe_load(model, device.kind, result.timing.duration_ns, result.timing.end_ns)
            self.residency.loaded(device, model, result.timing.end_ns)
            return
        self.residency.release(device, model, self._pages_on(model, device))
        if result.status is ActionStatus.ERROR and model not in self.residency.holders and model in self.queues:
            for request in self.queues.take_all(model):
                self._answer(request, Outcome.LOAD_FAILED, f"loading {model} failed: {result.message}")
            self._close_if_empty(model)

    # --- loads (planned by ``LoadPlanner``) ---------------------------------------------------
    def _issue_load(
        self, device: DeviceState, model: str, victims: list[str], now_ns: int, decisions: Decisions
    ) -> None:
        start = max(now_ns, device.load_lane.free_ns)
        for victim in victims:
            self.residency.release(device, victim, self._pages_on(victim, device))
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
        generation = self.residency.hold(device, model, ready, self._pages_on(model, device))
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
        after = now_ns + self.horizon_ns  # lanes due later than this wake the policy
        lanes = [self.residency.exec_due.next_after(after, always)]
        if self.loads.wanted:
            lanes.append(self.residency.load_due.next_after(after, _load_busy))
        for free_ns in lanes:
            if free_ns < best + self.horizon_ns:
                best = free_ns - self.horizon_ns
        return None if best == NEVER else best

    def _fastest_anywhere(self, model: str) -> int:
        return min(self.shapes.fastest_ns(model, kind) for kind in self.residency.kinds)

    def _pages_on(self, model: str, device: DeviceState) -> int:
        return self.pages_of(model, device.spec)

    def _idle_victims(self, device: DeviceState, model: str) -> list[str] | None:
        return self.loads.eviction_victims(device, model, idle_only=True)
