"""The Clockwork policy (INFER4), improved: predict, plan ahead, reject early.

Pure: it never reads the clock (``now_ns`` is passed in), does no I/O, and its only
randomness would come from the injected generator. One pass of ``schedule``:
``_expire`` (reject what can no longer make it), ``_plan_infers`` per device whose
exec lane frees within the horizon, ``_plan_loads`` for models whose demand the
devices holding them cannot serve.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mainspring.models.profile import ModelProfile
from mainspring.protocol import (
    Action,
    ActionResult,
    ActionStatus,
    DeviceSpec,
    EvictWeights,
    Infer,
    LoadWeights,
    Request,
    ResponseStatus,
)
from mainspring.scheduler.base import Decisions
from mainspring.scheduler.clockwork import membership
from mainspring.scheduler.clockwork.config import ClockworkConfig
from mainspring.scheduler.clockwork.estimator import DecayingRate, Estimator
from mainspring.scheduler.clockwork.loads import plan_loads
from mainspring.scheduler.clockwork.queues import ModelQueue
from mainspring.scheduler.clockwork.tracker import NEVER, DeviceState
from mainspring.scheduler.common import PolicyBookkeeping
from mainspring.time import NS_PER_S, ms_to_ns, ns_to_ms

EVICT_WINDOW_NS = 3600 * NS_PER_S  # an eviction is safe whenever it runs


class _Choice(NamedTuple):
    """A candidate batch; ordered by slack (``deadline`` is its most urgent request's)."""

    slack: int
    model: str
    start: int
    n_requests: int
    size: int
    deadline: int


@dataclass(slots=True)
class _Flight:
    action: Action
    requests: list[Request]


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
        self.config = config or ClockworkConfig()
        self.rng = rng or random.Random(0)
        self.estimator = Estimator(self.profiles, self.config.estimate_window, self.config.estimate_percentile)
        self._rate_memory_ns = ms_to_ns(self.config.rate_memory_ms)
        self.devices = [DeviceState(spec, self._rate_memory_ns) for spec in devices]
        self._model_demand: dict[str, DecayingRate] = {}
        self._device_by_id = {d.spec.device: d for d in self.devices}
        self._kinds = sorted({d.kind for d in self.devices})
        self.horizon_ns = self.config.horizon_ns
        self._slack_ns = self.config.window_slack_ns
        self.holders: dict[str, set[int]] = {}
        self.queues: dict[str, ModelQueue] = {}
        self.cold: set[str] = set()  # queued models that no device holds
        self.turned_away: set[str] = set()  # models held nowhere whose requests were rejected
        self.latest_load_start: dict[str, tuple[int, int]] = {}  # cold model -> (head request, time)
        self._live: dict[int, Request] = {}
        self._expiry: list[tuple[int, int, str]] = []
        self._in_flight: dict[int, _Flight] = {}
        self._batch_sizes: dict[str, tuple[int, ...]] = {}
        self.last_replication_check_ns = -NEVER

    # --- the contract ------------------------------------------------------------
    def on_request(self, request: Request, now_ns: int) -> None:
        model = request.model
        if self._refuse_unservable(request, (d.spec for d in self.devices)):
            return
        self._record_demand(model, now_ns)
        earliest = self._admission_bound(request, now_ns)
        if earliest > request.deadline_ns:
            need = ns_to_ms(earliest - request.arrival_ns)
            slo = ns_to_ms(request.slo_ns)
            reason = f"deadline cannot be met: earliest completion {need:.2f} ms after arrival, SLO {slo:.2f} ms"
            self._answer(request, ResponseStatus.REJECTED, reason)
            if model not in self.holders:
                self.turned_away.add(model)  # load it anyway, so that later requests can be served
        elif self.config.share_admission and not self._within_share(request, now_ns):
            reason = f"overloaded: requests queued for {model} already fill its share of the devices until the deadline"
            self._answer(request, ResponseStatus.REJECTED, reason)
        else:
            self._enqueue(request)

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        flight = self._in_flight.pop(result.action_id)
        action = flight.action
        device = self._device_by_id[action.device]
        anchor = result.timing.end_ns if result.timing is not None else now_ns
        if action.model not in self.profiles:  # unloaded meanwhile; its requests were answered then
            (device.exec_lane if isinstance(action, Infer) else device.load_lane).complete(action.action_id, anchor)
            return
        if isinstance(action, Infer):
            device.exec_lane.complete(action.action_id, anchor)
            device.unpin(action.model)
            self._infer_done(action, flight.requests, result, device, now_ns)
        else:
            device.load_lane.complete(action.action_id, anchor)
            if isinstance(action, LoadWeights):
                device.unpin(action.model)
                self._load_done(action, result, device)

    def schedule(self, now_ns: int) -> Decisions:
        decisions = Decisions()
        self._expire(now_ns)
        limit = now_ns + self.horizon_ns
        for device in self.devices:
            if device.waiting and device.exec_lane.free_ns <= limit:
                self._plan_infers(device, now_ns, decisions)
        if self.queues or self.turned_away:
            plan_loads(self, now_ns, decisions)
        decisions.responses = self._take_responses()
        decisions.wakeup_ns = self._next_wakeup(now_ns)
        return decisions

    # --- membership (devices and models that come and go) ------------------------------
    def add_device(self, spec: DeviceSpec) -> None:
        membership.add_device(self, spec)

    def remove_device(self, device: int, now_ns: int) -> None:
        membership.remove_device(self, device, now_ns)

    def add_model(self, profile: ModelProfile) -> None:
        membership.add_model(self, profile)

    def remove_model(self, model: str, now_ns: int) -> None:
        membership.remove_model(self, model, now_ns)

    # --- admission and queues ------------------------------------------------------
    def _admission_bound(self, request: Request, now_ns: int) -> int:
        """A lower bound on when ``request`` can complete: the earliest completion of its model,
        and, when every queued request of the model is due no later, after all of them too
        (in full batches, shared by the devices holding the model)."""
        model = request.model
        earliest = self._earliest_completion(model, now_ns)
        queue = self.queues.get(model)
        holders = self.holders.get(model)
        if queue is None or not holders or request.deadline_ns < queue.max_deadline_ns:
            return earliest
        start = min(max(now_ns, self._device_by_id[d].exec_lane.free_ns) for d in holders)
        return max(earliest, start + self._queued_work_ns(model, queue.count + 1) // len(holders))

    def _earliest_completion(self, model: str, now_ns: int) -> int:
        """Best case over devices: on a holder as soon as its lane frees, else after a cold load."""
        best = NEVER
        for device_id in self.holders.get(model, ()):
            d = self._device_by_id[device_id]
            start = max(now_ns, d.exec_lane.free_ns, d.ready_ns[model])
            best = min(best, start + self.fastest_ns(model, d.kind))
        if best == NEVER:
            load = {kind: self.estimator.load_ns(model, kind) for kind in self._kinds}
            run = {kind: self.fastest_ns(model, kind) for kind in self._kinds}
            for d in self.devices:
                ready = max(now_ns, d.load_lane.free_ns) + load[d.kind]
                best = min(best, max(ready, d.exec_lane.free_ns) + run[d.kind])
        return best

    def _record_demand(self, model: str, now_ns: int) -> None:
        """Remember how much device time this model's arrivals ask for, on the devices holding it."""
        work = self.fastest_ns(model, self.devices[0].kind)
        rate = self._model_demand.get(model)
        if rate is None:
            rate = self._model_demand[model] = DecayingRate(self._rate_memory_ns)
        rate.add(work, now_ns)
        holders = self.holders.get(model, ())
        for device_id in holders:
            self._device_by_id[device_id].demand.add(work / len(holders), now_ns)

    def model_demand(self, model: str, now_ns: int) -> float:
        rate = self._model_demand.get(model)
        return 0.0 if rate is None else rate.value(now_ns)

    def _within_share(self, request: Request, now_ns: int) -> bool:
        """A model whose recent demand exceeds its share of its holders (what the other models'
        demand leaves it, at least ``min_share``) may queue only as much work as that share
        of their time until this request's deadline. Models within their share pass."""
        model = request.model
        holders = self.holders.get(model)
        if not holders:
            return True  # cold: the load planner decides
        own = self.model_demand(model, now_ns) / len(holders)
        devices = [self._device_by_id[device_id] for device_id in holders]
        if not any(self._over_share(model, d, now_ns) for d in devices):
            return True  # a model within its share is only ever refused by its deadline
        room = 0.0
        for d in devices:
            share = max(self.config.min_share, 1.0 - (d.demand.value(now_ns) - own))
            room += max(0, request.deadline_ns - max(now_ns, d.exec_lane.free_ns)) * share
        queue = self.queues.get(model)
        count = 1 + (queue.count if queue is not None else 0)
        return self._queued_work_ns(model, count) <= room

    def _over_share(self, model: str, device: DeviceState, now_ns: int) -> bool:
        """Does ``model`` ask more of ``device`` than the other models' demand leaves it?"""
        holders = self.holders.get(model)
        if not holders:
            return False
        own = self.model_demand(model, now_ns) / len(holders)
        return own > max(self.config.min_share, 1.0 - (device.demand.value(now_ns) - own))

    def _queued_work_ns(self, model: str, count: int) -> int:
        """Exec time of ``count`` requests in full batches of the largest size, then one padded batch."""
        kind = self.devices[0].kind
        largest = self.batch_sizes(model)[-1]
        full, rest = divmod(count, largest)
        work = full * self.estimator.exec_ns(model, largest, kind)
        return work + (self.estimator.exec_ns(model, self.padded(model, rest), kind) if rest else 0)

    def _enqueue(self, request: Request) -> None:
        model = request.model
        queue = self.queues.get(model)
        if queue is None:
            queue = self.queues[model] = ModelQueue(model, self._live)
            holders = self.holders.get(model, ())
            for device_id in holders:
                self._device_by_id[device_id].waiting.add(model)
            if not holders:
                self.cold.add(model)
        queue.push(request)
        fastest = min(self.fastest_ns(model, kind) for kind in self._kinds)
        heapq.heappush(self._expiry, (request.deadline_ns - fastest + 1, request.id, model))

    def _expire(self, now_ns: int) -> None:
        """Reject queued requests that no device could now finish in time."""
        expiry = self._expiry
        while expiry and expiry[0][0] <= now_ns:
            _, request_id, model = heapq.heappop(expiry)
            request = self._live.get(request_id)
            if request is not None:
                self.queues[model].forget(request_id)
                self._answer(request, ResponseStatus.REJECTED, "deadline can no longer be met")
                self._drop_queue_if_empty(model)

    def _drop_queue_if_empty(self, model: str) -> None:
        queue = self.queues.get(model)
        if queue is not None and queue.count == 0:
            del self.queues[model]
            self.cold.discard(model)
            self.latest_load_start.pop(model, None)
            for device_id in self.holders.get(model, ()):
                self._device_by_id[device_id].waiting.discard(model)

    # --- inference planning -----------------------------------------------------------
    def _plan_infers(self, device: DeviceState, now_ns: int, decisions: Decisions) -> None:
        """Fill the exec lane up to the horizon with the least-slack feasible batches."""
        limit = now_ns + self.horizon_ns
        while device.waiting:
            lane_start = max(now_ns, device.exec_lane.free_ns)
            if lane_start > limit:
                return
            choices = []
            for model in list(device.waiting):
                choice = self._best_batch(device, model, lane_start, now_ns)
                if choice is not None:
                    choices.append(choice)
            if not choices:
                return
            chosen = min(choices)
            if len(choices) > 1 and self.config.lookahead and self._over_share(chosen.model, device, now_ns):
                chosen = self._spare_the_next(device, chosen, choices)
            self._issue_infer(device, chosen, now_ns, decisions)

    def _best_batch(self, device: DeviceState, model: str, start: int, now_ns: int) -> _Choice | None:
        """The largest batch of ``model`` that meets its most urgent deadline here, with its slack."""
        if model in device.loading:
            return None  # planned when the load reports: an infer must never race its own load
        queue = self.queues[model]
        head = self._feasible_head(queue, now_ns)
        if head is None:
            return None
        return self._batch_within(device, model, start, head.deadline_ns)

    def _batch_within(self, device: DeviceState, model: str, start: int, finish_by: int) -> _Choice | None:
        """The largest batch of ``model`` starting at ``start`` that ends by ``finish_by``."""
        queue = self.queues[model]
        head = queue.head()
        if head is None:
            return None
        kind = device.kind
        longest = self.config.max_batch_slo_fraction * head.slo_ns if len(device.waiting) > 1 else NEVER
        for size in reversed(self.batch_sizes(model)):
            exec_ns = self.estimator.exec_ns(model, size, kind)
            if start + exec_ns <= finish_by and (exec_ns <= longest or size == self.batch_sizes(model)[0]):
                count = min(queue.count, size)
                padded = self.padded(model, count)
                slack = head.deadline_ns - start - self.estimator.exec_ns(model, padded, kind)
                return _Choice(slack, model, start, count, padded, head.deadline_ns)
        return None

    def _spare_the_next(self, device: DeviceState, chosen: _Choice, choices: list[_Choice]) -> _Choice:
        """One step of lookahead that Clockwork's bump lacks: if the least-slack batch would
        end too late for the next most urgent model, run that model first when the chosen
        one can afford the wait, else shrink the chosen batch so both make it."""
        kind = device.kind
        chosen_end = chosen.start + self.estimator.exec_ns(chosen.model, chosen.size, kind)
        others = [c for c in choices if c.model != chosen.model]
        urgent = min(others, key=lambda c: c.deadline - self.fastest_ns(c.model, kind))
        urgent_latest_start = urgent.deadline - self.fastest_ns(urgent.model, kind)
        if chosen_end <= urgent_latest_start:
            return chosen
        chosen_ns = self.estimator.exec_ns(chosen.model, chosen.size, kind)
        first = self._batch_within(
            device, urgent.model, urgent.start, min(urgent.deadline, chosen.deadline - chosen_ns)
        )
        if first is not None:
            return first
        smaller = self._batch_within(device, chosen.model, chosen.start, urgent_latest_start)
        return smaller if smaller is not None and smaller.deadline >= chosen.deadline else chosen

    def _feasible_head(self, queue: ModelQueue, now_ns: int) -> Request | None:
        """The most urgent request that some holder can still serve; rejects the ones none can."""
        while True:
            head = queue.head()
            if head is None:
                self._drop_queue_if_empty(queue.model)
                return None
            if self._earliest_completion(queue.model, now_ns) <= head.deadline_ns:
                return head
            queue.pop()
            self._answer(head, ResponseStatus.REJECTED, "deadline can no longer be met")

    def _issue_infer(self, device: DeviceState, choice: _Choice, now_ns: int, decisions: Decisions) -> None:
        _, model, start, count, size, _ = choice
        queue = self.queues[model]
        batch = [queue.pop() for _ in range(count)]
        expected = self.estimator.exec_ns(model, size, device.kind)
        tightest = min(r.deadline_ns for r in batch)
        latest = min(tightest - expected, start + self._slack_ns)
        action = Infer(
            self._new_action_id(), device.spec.device, model, start, latest, expected, tuple(r.id for r in batch), size
        )
        device.exec_lane.plan(action.action_id, start, expected)
        device.pin(model)
        device.touch(model, now_ns)
        self._in_flight[action.action_id] = _Flight(action, batch)
        decisions.actions.append(action)
        self._drop_queue_if_empty(model)

    # --- results ---------------------------------------------------------------------
    def _infer_done(
        self, action: Infer, batch: list[Request], result: ActionResult, device: DeviceState, now_ns: int
    ) -> None:
        if result.ok:
            assert result.timing is not None
            self.estimator.observe_exec(action.model, action.batch_size, device.kind, result.timing.duration_ns)
            for request in batch:
                self._answer(request, ResponseStatus.SUCCESS, action_id=action.action_id)
            return
        if result.status is ActionStatus.ERROR:
            for request in batch:
                self._answer(request, ResponseStatus.ERROR, f"inference failed: {result.message}")
            return
        if result.status is ActionStatus.NOT_RESIDENT and device.holds(action.model):
            self.release(device, action.model)  # the worker disagrees with our view: believe it
        for request in batch:  # refused: back to the queue; expiry rejects what cannot make it
            self._enqueue(request)

    def _load_done(self, action: LoadWeights, result: ActionResult, device: DeviceState) -> None:
        model = action.model
        if result.ok:
            assert result.timing is not None
            self.estimator.observe_load(model, device.kind, result.timing.duration_ns)
            device.ready_ns[model] = result.timing.end_ns
            device.loading.discard(model)
            return
        self.release(device, model)
        if result.status is ActionStatus.ERROR and not self.holders.get(model) and model in self.queues:
            queue = self.queues[model]
            while queue.count:
                self._answer(queue.pop(), ResponseStatus.ERROR, f"loading {model} failed: {result.message}")
            self._drop_queue_if_empty(model)

    # --- residency (used by load planning) ------------------------------------------------
    def hold(self, device: DeviceState, model: str, ready_ns: int) -> None:
        device.ready_ns[model] = ready_ns
        device.free_pages -= self.pages_of(model, device.spec)
        device.touch(model, ready_ns)
        self.holders.setdefault(model, set()).add(device.spec.device)
        self.turned_away.discard(model)
        if model in self.queues:
            device.waiting.add(model)
            self.cold.discard(model)

    def release(self, device: DeviceState, model: str) -> None:
        if device.ready_ns.pop(model, None) is None:
            return
        device.loading.discard(model)
        device.free_pages += self.pages_of(model, device.spec)
        device.last_used.pop(model, None)
        device.waiting.discard(model)
        holders = self.holders[model]
        holders.discard(device.spec.device)
        if not holders:
            del self.holders[model]
            if model in self.queues:
                self.cold.add(model)

    def issue_load(
        self, device: DeviceState, model: str, victims: list[str], now_ns: int, decisions: Decisions
    ) -> None:
        start = max(now_ns, device.load_lane.free_ns)
        for victim in victims:
            self.release(device, victim)
            evict = EvictWeights(self._new_action_id(), device.spec.device, victim, start, start + EVICT_WINDOW_NS, 0)
            device.load_lane.plan(evict.action_id, start, 0)
            self._in_flight[evict.action_id] = _Flight(evict, [])
            decisions.actions.append(evict)
        expected = self.estimator.load_ns(model, device.kind)
        load = LoadWeights(self._new_action_id(), device.spec.device, model, start, start + self._slack_ns, expected)
        ready = device.load_lane.plan(load.action_id, start, expected)
        self.hold(device, model, ready)
        device.loading.add(model)
        device.pin(model)
        self._in_flight[load.action_id] = _Flight(load, [])
        decisions.actions.append(load)

    # --- helpers ---------------------------------------------------------------------------
    def _next_wakeup(self, now_ns: int) -> int | None:
        """The earliest future time something is due: an expiry, or a lane freeing within the horizon."""
        expiry = self._expiry
        while expiry and expiry[0][1] not in self._live:
            heapq.heappop(expiry)
        best = expiry[0][0] if expiry and expiry[0][0] > now_ns else NEVER
        after = now_ns + self.horizon_ns  # lanes due later than this wake the policy
        loads_wanted = bool(self.queues or self.turned_away)
        for d in self.devices:
            if d.waiting and after < d.exec_lane.free_ns < best + self.horizon_ns:
                best = d.exec_lane.free_ns - self.horizon_ns
            if loads_wanted and d.load_lane.busy and after < d.load_lane.free_ns < best + self.horizon_ns:
                best = d.load_lane.free_ns - self.horizon_ns
        return None if best == NEVER else best

    def batch_sizes(self, model: str) -> tuple[int, ...]:
        sizes = self._batch_sizes.get(model)
        if sizes is None:
            cap = self.config.max_batch_size
            sizes = tuple(b for b in self.profiles[model].batch_sizes if b <= cap) or (
                self.profiles[model].batch_sizes[0],
            )
            self._batch_sizes[model] = sizes
        return sizes

    def fastest_ns(self, model: str, kind: str) -> int:
        """Estimate of the smallest supported batch: the least any request of ``model`` needs."""
        return self.estimator.exec_ns(model, self.batch_sizes(model)[0], kind)

    def padded(self, model: str, count: int) -> int:
        for size in self.batch_sizes(model):
            if size >= count:
                return size
        return self.batch_sizes(model)[-1]
