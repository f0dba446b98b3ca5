"""Clockwork's INFER4 scheduler as published, a faithful reference for ``clockwork``.

Follows ``concurrent_infer_and_load_scheduler.cpp`` (namespace ``scheduler::infer4``):

- A request's scheduling deadline is its deadline less a 5 ms buffer (at least the
  schedule-ahead plus the buffer after arrival). There is no admission control.
- Each request adds one *strategy* per supported batch size to every device holding its
  model, with priority ``deadline - estimate(batch)``; each device pops the lowest
  priority first while its exec lane frees within the schedule-ahead (10 ms). A strategy
  runs if its batch completes by the deadline and enough requests are queued from its
  request on; it is bumped to the largest batch the queue allows, if that still fits,
  and requests ahead of it that would miss are dropped.
- Actions: earliest = now, latest = max(now + 1 ms + latest_delta, planned start +
  latest_delta) with latest_delta 10 ms; any refusal fails the batch's requests.
- Loads: per device at most 2 in flight, one at a time when the load lane frees within
  the schedule-ahead, chosen by the load tracker (``demand.py``); evictions by its order.
- Estimates: p99 of the last 10 measurements, the profile until the first one.

Departures, each one a known defect of the source rather than a design choice
(DESIGN.md section 4): a dropped request is answered when it is dropped, not at its
deadline; devices and models may come and go; a model with work in flight is not
evicted (the source may evict under a running batch, which fails it).
Load priorities are worked out afresh at each load decision (``demand.py``). The source
refreshes a model's priority only when the model itself changes, so its priorities lag the
devices' weights (``docs/scheduler/infer4-and-infer5.md``).
"""

from __future__ import annotations

import heapq
import random
from bisect import insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mainspring.models.profile import ModelProfile
from mainspring.protocol import (
    Action,
    ActionResult,
    DeviceSpec,
    EvictWeights,
    Infer,
    LoadWeights,
    Outcome,
    Request,
)
from mainspring.protocol.model_names import client_name
from mainspring.scheduler.base import Decisions, Forecast
from mainspring.scheduler.common import PolicyBookkeeping
from mainspring.scheduler.estimator import Estimator
from mainspring.scheduler.infer4.demand import LoadTracker
from mainspring.scheduler.infer4.forecast import device_forecast
from mainspring.scheduler.infer4.state import Infer4Device, ModelQueue, QueuedRequest, arrival_seq, position_of
from mainspring.scheduler.lanes import NEVER
from mainspring.time import NS_PER_MS, NS_PER_S

BUFFER_NS = 5 * NS_PER_MS  # aim this much before the deadline
FUTURE_NS = 1 * NS_PER_MS  # expected lag in reaching the worker
LATEST_DELTA_NS = 10 * NS_PER_MS  # how late an action may start
SCHEDULE_AHEAD_NS = 10 * NS_PER_MS
MAX_LOADS = 2  # loads in flight per device
MIN_LOAD_GAP_NS = 100_000  # between two load decisions on one device
MAX_LOAD_SLO_NS = 25 * NS_PER_MS
EVICT_WINDOW_NS = 3600 * NS_PER_S


@dataclass(slots=True)
class _Flight:
    action: Action
    batch: list[QueuedRequest]


class Infer4Scheduler(PolicyBookkeeping):
    """INFER4 on the ``Scheduler`` contract: one pass plans infers, then loads, on every device."""

    schedule_ahead_ns = SCHEDULE_AHEAD_NS  # INFER5 takes both from its command line (``infer5/policy.py``)
    latest_delta_ns = LATEST_DELTA_NS

    def __init__(
        self,
        profiles: Mapping[str, ModelProfile],
        devices: Sequence[DeviceSpec],
        rng: random.Random | None = None,
        default_slo_ns: int = 100 * NS_PER_MS,
    ) -> None:
        super().__init__(profiles)
        self.rng = rng or random.Random(0)
        self.estimator = Estimator(self.profiles, 10, 99.0, borrow_kind_ratio=False)
        self.tracker = LoadTracker(default_slo_ns)
        self.devices: dict[int, Infer4Device] = {}
        self.models: dict[str, ModelQueue] = {}
        self._in_flight: dict[int, _Flight] = {}
        self._timeouts: list[tuple[int, int, str]] = []  # scheduling deadline, arrival number, model
        self._strategy_seq = 0
        for spec in devices:
            self.add_device(spec)

    # --- the contract ------------------------------------------------------------
    def on_request(self, request: Request, now_ns: int) -> None:
        if self._refuse_unservable(request, (d.spec for d in self.devices.values())):
            return
        name = request.model
        slo = request.slo_ns
        b1 = self._b1_ns(name)
        exec_slo = max(slo - BUFFER_NS, self.schedule_ahead_ns + BUFFER_NS)
        load_ns = max(self.estimator.load_ns(name, kind) for kind in self._kinds())
        load_budget = load_ns + b1 + BUFFER_NS + self.schedule_ahead_ns
        # As the source's unsigned arithmetic: a budget beyond the SLO leaves the SLO itself.
        load_slo = min(MAX_LOAD_SLO_NS, slo - load_budget if load_budget <= slo else slo)
        load_slo = max(load_slo, self.schedule_ahead_ns + BUFFER_NS)
        demand = self.tracker.add_request(name, b1, exec_slo, load_slo, now_ns)
        model = self.models.setdefault(name, ModelQueue())
        queued = QueuedRequest(request, model.next_seq, request.arrival_ns + exec_slo, demand)
        model.next_seq += 1
        model.queue.append(queued)
        heapq.heappush(self._timeouts, (queued.deadline_ns, queued.seq, name))
        self._wants_loads()
        for device in self.devices.values():
            if name in device.loaded:
                self._add_strategies(device, name, queued)

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        flight = self._in_flight.pop(result.action_id, None)
        if flight is None:
            return
        self._wants_loads()
        action = flight.action
        device = self.devices.get(action.device)
        if device is None:
            return
        anchor = result.timing.end_ns if result.timing is not None else now_ns
        if isinstance(action, Infer):
            device.exec_lane.complete(action.action_id, anchor)
            self._unbusy(device, action.model)
            self._infer_done(action, flight.batch, result, device)
        elif isinstance(action, LoadWeights):
            device.load_lane.complete(action.action_id, anchor)
            device.loads_in_flight -= 1
            self._load_done(action, result, device)
        else:
            device.load_lane.complete(action.action_id, anchor)

    def schedule(self, now_ns: int) -> Decisions:
        decisions = Decisions()
        self._drop_timed_out(now_ns)
        self.tracker.check_load_deadlines(now_ns)
        for device in self.devices.values():
            self._schedule_infers(device, now_ns, decisions)
        for device in self.devices.values():
            self._schedule_load(device, now_ns, decisions)
        decisions.responses = self._take_responses()
        decisions.wakeup_ns = self._next_wakeup(now_ns)
        return decisions

    # --- membership ----------------------------------------------------------------
    def add_device(self, spec: DeviceSpec) -> None:
        if spec.device in self.devices:
            raise ValueError(f"device {spec.device} is already known")
        device = self.devices[spec.device] = Infer4Device(spec)
        self.tracker.add_device(spec.device)
        for model, pages in self.adoptable(spec):
            self._adopt(device, model, pages)

    def _adopt(self, device: Infer4Device, model: str, pages: int) -> None:
        """Book ``model`` as loaded on ``device`` (its weights are there already, or it has none)."""
        device.loaded.add(model)
        device.free_pages -= pages
        self.tracker.load_started(model, device.spec.device)
        self.tracker.load_finished(model, device.spec.device, True)
        for queued in self.models[model].queue if model in self.models else ():
            self._add_strategies(device, model, queued)

    def _hold_everywhere(self, model: str) -> None:
        for device in self.devices.values():
            self._adopt(device, model, 0)

    def remove_device(self, device: int, now_ns: int) -> None:
        del self.devices[device]
        self.tracker.remove_device(device)
        for action_id, flight in list(self._in_flight.items()):
            if flight.action.device == device:
                del self._in_flight[action_id]
                self._requeue(flight.batch, f"worker of device {device} was lost", now_ns)
        if not self.devices:
            for name in list(self.models):
                self._fail(list(self.models.pop(name).queue), Outcome.NO_WORKER, "no worker is connected", None)

    def _requeue(self, batch: list[QueuedRequest], reason: str, now_ns: int) -> None:
        """Requests of a lost batch go back to their queue if they can still start in time."""
        for queued in batch:
            name = queued.request.model
            model = self.models.get(name)
            if model is None or not self.devices or now_ns + self._b1_ns(name) > queued.deadline_ns:
                self._fail([queued], Outcome.WORKER_LOST, f"{reason}; the deadline cannot be met", None)
                continue
            self.tracker.completed([queued.demand], None)  # its demand starts again, a load included
            remaining = queued.deadline_ns - now_ns
            queued.demand = self.tracker.add_request(name, self._b1_ns(name), remaining, remaining, now_ns)
            insort(model.queue, queued, key=arrival_seq)
            heapq.heappush(self._timeouts, (queued.deadline_ns, queued.seq, name))
            for device in self.devices.values():
                if name in device.loaded:
                    self._add_strategies(device, name, queued)

    def remove_model(self, model: str, now_ns: int) -> None:
        reason = f"model {client_name(model)!r} was unloaded"
        entry = self.models.pop(model, None)
        if entry is not None:
            self._fail(list(entry.queue), Outcome.MODEL_UNLOADED, reason, None)
        for flight in self._in_flight.values():
            if flight.action.model == model and isinstance(flight.action, Infer):
                self._fail(flight.batch, Outcome.MODEL_UNLOADED, reason, None)
                flight.batch = []
        for device in self.devices.values():
            if model in device.loaded or model in device.loading:
                device.free_pages += self.pages_of(model, device.spec)
            device.loaded.discard(model)
            device.loading.pop(model, None)
        self.tracker.forget(model)
        self.estimator.forget(model)
        self._forget_model(model)

    # --- inference ---------------------------------------------------------------------
    def _add_strategies(self, device: Infer4Device, name: str, queued: QueuedRequest) -> None:
        kind = device.spec.kind
        for size in self.profiles[name].batch_sizes:
            priority = queued.deadline_ns - self.estimator.exec_ns(name, size, kind)
            self._strategy_seq += 1
            heapq.heappush(device.strategies, (priority, self._strategy_seq, size, name, queued.seq))

    def _schedule_infers(self, device: Infer4Device, now_ns: int, decisions: Decisions) -> None:
        strategies = device.strategies
        while strategies:
            free_at = max(now_ns + FUTURE_NS, device.exec_lane.free_ns)
            if free_at >= now_ns + self.schedule_ahead_ns:
                return
            _, _, size, name, seq = heapq.heappop(strategies)
            if name in device.loaded:
                self._try_dequeue(device, name, size, seq, free_at, now_ns, decisions)

    def _try_dequeue(
        self, device: Infer4Device, name: str, size: int, seq: int, free_at: int, now_ns: int, decisions: Decisions
    ) -> None:
        model = self.models.get(name)
        index = None if model is None else position_of(model.queue, seq)
        if model is None or index is None:
            return  # the strategy's request was served or dropped
        queue = model.queue
        request_id = queue[index].request.id
        kind = device.spec.kind
        exec_ns = self.estimator.exec_ns(name, size, kind)
        deadline = queue[index].deadline_ns
        if deadline < free_at + exec_ns:
            return
        index -= self._drop_unstartable(name, model, free_at)
        available = len(queue) - index
        if available < size:
            return
        bumped = self._batch_lookup(name, available)
        if bumped > size:
            bumped_ns = self.estimator.exec_ns(name, bumped, kind)
            if free_at + bumped_ns > deadline:
                return
            size, exec_ns = bumped, bumped_ns
        completion = free_at + exec_ns
        skipped = []
        while queue and queue[0].request.id != request_id and queue[0].deadline_ns < completion:
            skipped.append(queue.popleft())
        self._fail(skipped, Outcome.EXPIRED_IN_QUEUE, "skipped: the deadline cannot be met beside a larger batch", None)
        batch = [queue.popleft() for _ in range(size)]
        self._issue_infer(device, name, batch, free_at, exec_ns, now_ns, decisions)

    def _drop_unstartable(self, name: str, model: ModelQueue, free_at: int) -> int:
        """Drop queued requests whose deadline passes before the lane frees; returns how many."""
        dropped = []
        while model.queue and model.queue[0].deadline_ns < free_at:
            dropped.append(model.queue.popleft())
        self._fail(dropped, Outcome.QUEUE_TIMEOUT, "could not start in time", None)
        return len(dropped)

    def _issue_infer(
        self,
        device: Infer4Device,
        name: str,
        batch: list[QueuedRequest],
        start_ns: int,
        exec_ns: int,
        now_ns: int,
        decisions: Decisions,
    ) -> None:
        latest = max(now_ns + FUTURE_NS + self.latest_delta_ns, start_ns + self.latest_delta_ns)
        action = Infer(
            action_id=self._new_action_id(),
            device=device.spec.device,
            model=name,
            earliest_ns=now_ns,
            latest_ns=latest,
            expected_duration_ns=exec_ns,
            request_ids=tuple(q.request.id for q in batch),
            batch_size=len(batch),
            deadlines_ns=tuple(q.request.ready_by_ns for q in batch),  # INFER4 plans by its buffer, not by these
        )
        device.exec_lane.plan(action.action_id, start_ns, exec_ns)
        device.busy[name] = device.busy.get(name, 0) + 1
        self._in_flight[action.action_id] = _Flight(action, batch)
        self.tracker.executing([q.demand for q in batch], device.spec.device)
        decisions.actions.append(action)

    def _infer_done(
        self, action: Infer, batch: list[QueuedRequest], result: ActionResult, device: Infer4Device
    ) -> None:
        if not batch:
            return
        if result.ok:
            assert result.timing is not None
            if not result.isolated:
                self.estimator.observe_exec(
                    action.model, action.batch_size, device.spec.kind, result.timing.duration_ns, result.timing.end_ns
                )
            self._answer_served([q.request for q in batch], result, action.action_id)
            self.tracker.completed([q.demand for q in batch], device.spec.device)
            return
        message = f"inference failed: {result.status.value} {result.message}".strip()
        self._fail(batch, Outcome.INFERENCE_FAILED, message, device.spec.device)

    def _drop_timed_out(self, now_ns: int) -> None:
        """Requests still queued at their scheduling deadline are dropped (answered now)."""
        timeouts = self._timeouts
        while timeouts and timeouts[0][0] <= now_ns:
            _, seq, name = heapq.heappop(timeouts)
            model = self.models.get(name)
            index = None if model is None else position_of(model.queue, seq)
            if model is not None and index is not None:
                queued = model.queue[index]
                del model.queue[index]
                self._fail([queued], Outcome.QUEUE_TIMEOUT, "timed out in the queue", None)

    def _fail(
        self,
        batch: list[QueuedRequest],
        outcome: Outcome,
        reason: str,
        device: int | None,
    ) -> None:
        for queued in batch:
            self._answer(queued.request, outcome, reason)
        if batch and batch[0].request.model in self.profiles:
            self.tracker.completed([q.demand for q in batch], device)

    # --- loads ---------------------------------------------------------------------------
    def _schedule_load(self, device: Infer4Device, now_ns: int, decisions: Decisions) -> None:
        if now_ns - device.last_load_ns < MIN_LOAD_GAP_NS or device.loads_in_flight >= MAX_LOADS:
            return
        available = max(now_ns + FUTURE_NS, device.load_lane.free_ns)
        if available >= now_ns + self.schedule_ahead_ns:
            return
        device.last_load_ns = now_ns
        name = self.tracker.model_to_load(device.spec.device)
        device.load_wanted = name is not None
        if name is None:
            return
        need = self.pages_of(name, device.spec)
        if need > device.spec.total_pages:
            return
        held = [m for m in sorted(device.loaded) if m not in device.busy and self.evictable(m)]  # sorted: repeatable
        for victim in self.tracker.eviction_order(device.spec.device, held):
            if device.free_pages >= need:
                break
            self._evict(device, victim, now_ns, decisions)
        if device.free_pages < need:
            return
        device.free_pages -= need
        expected = self.estimator.load_ns(name, device.spec.kind)
        latest = max(now_ns + FUTURE_NS + self.latest_delta_ns, available + self.latest_delta_ns)
        load = LoadWeights(self._new_action_id(), device.spec.device, name, now_ns, latest, expected)
        device.load_lane.plan(load.action_id, available, expected)
        device.loading[name] = load.action_id
        device.loads_in_flight += 1
        self.tracker.load_started(name, device.spec.device)
        self._in_flight[load.action_id] = _Flight(load, [])
        decisions.actions.append(load)

    def _evict(self, device: Infer4Device, victim: str, now_ns: int, decisions: Decisions) -> None:
        device.loaded.discard(victim)
        device.free_pages += self.pages_of(victim, device.spec)
        self.tracker.evicted(victim, device.spec.device)
        evict = EvictWeights(self._new_action_id(), device.spec.device, victim, 0, now_ns + EVICT_WINDOW_NS, 0)
        self._in_flight[evict.action_id] = _Flight(evict, [])
        decisions.actions.append(evict)

    def _load_done(self, action: LoadWeights, result: ActionResult, device: Infer4Device) -> None:
        name = action.model
        if device.loading.get(name) != action.action_id:
            return  # the model was unloaded meanwhile (and perhaps added and loading again: not this load)
        del device.loading[name]
        self.tracker.load_finished(name, device.spec.device, result.ok)
        if not result.ok:
            device.free_pages += self.pages_of(name, device.spec)
            return
        assert result.timing is not None
        self.estimator.observe_load(name, device.spec.kind, result.timing.duration_ns, result.timing.end_ns)
        device.loaded.add(name)
        model = self.models.get(name)
        for queued in model.queue if model is not None else ():
            self._add_strategies(device, name, queued)

    def forecast(self, models: Iterable[str], now_ns: int) -> Forecast:
        """When a batch of one of each model would end here, from the lanes as booked (a read)."""
        return device_forecast(self.devices.values(), self.estimator, self.profiles, models, now_ns)

    # --- helpers ---------------------------------------------------------------------------
    def _unbusy(self, device: Infer4Device, name: str) -> None:
        count = device.busy.get(name, 0) - 1
        if count > 0:
            device.busy[name] = count
        else:
            device.busy.pop(name, None)

    def _wants_loads(self) -> None:
        """Demand changed: every device asks the tracker again at its next pass."""
        for device in self.devices.values():
            device.load_wanted = True

    def _kinds(self) -> set[str]:
        return {d.spec.kind for d in self.devices.values()}

    def _b1_ns(self, name: str) -> int:
        return max(self.estimator.exec_ns(name, self.profiles[name].batch_sizes[0], kind) for kind in self._kinds())

    def _batch_lookup(self, name: str, count: int) -> int:
        """The largest supported batch of at most ``count`` requests (no padding, as the source)."""
        best = self.profiles[name].batch_sizes[0]
        for size in self.profiles[name].batch_sizes:
            if size <= count:
                best = size
        return best

    def _next_wakeup(self, now_ns: int) -> int | None:
        """The next timeout, or a lane freeing within the schedule-ahead."""
        best = NEVER
        if self._timeouts:
            best = max(self._timeouts[0][0], now_ns + 1)
        for device in self.devices.values():
            if device.strategies:
                best = min(best, max(now_ns + 1, device.exec_lane.free_ns - self.schedule_ahead_ns + 1))
            if device.load_wanted and device.loads_in_flight < MAX_LOADS:
                due = max(device.load_lane.free_ns - self.schedule_ahead_ns + 1, device.last_load_ns + MIN_LOAD_GAP_NS)
                best = min(best, max(now_ns + 1, due))
        return None if best == NEVER else best
