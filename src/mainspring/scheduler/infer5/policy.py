"""Clockwork's INFER5 scheduler, the one the authors ran for Figs. 5-8 and 11 (INFER4, ``infer4/``, ran
Figs. 9-10). It follows ``controller/infer5/infer5_scheduler.cpp`` at fbd2f11 of the authors' repository
(mirrored as ``malixian/clockwork``) and keeps INFER4's request deadlines and load lane.

How it differs from INFER4:

- Queues: each model keeps one FIFO per supported batch size, every request in each. Before a batch is
  taken, each queue drops from its front the requests that could not finish at its size if the batch
  started when the lane frees (they are not answered then: only their timeout answers them).
- Strategies (``strategies.py``): per model active on a device, one per non-empty queue, with priority
  ``front's deadline - estimate(size)``, ordered by priority, then the smaller size, then the model; a
  large batch's longer estimate moves it ahead. The front may have timed out already: it stays in the
  queues until a batch is tried, and its deadline, past, still sets the priority. Strategies last: they
  are worked out when the model is activated (a request arrives while it is not active, or its load
  ends) and kept, priorities and all, until one of them is tried.
- A strategy of size ``b`` runs the largest size ``s`` whose queue, and every smaller size's before it,
  holds ``s`` requests, if ``s >= b``; the other queues catch up past the requests taken. A model whose
  strategy fails keeps only sizes below ``b`` until it next runs a batch or is deactivated (no strategy
  left, or tried on a device that does not hold it).
- Batches of at most 8 (``max_batch``) and no size estimated above 250 ms; the schedule-ahead (10 ms;
  the authors passed 5 ms for Figs. 7, 8 and 11) is also each action's latest delta.
- Its own load tracker (``tracker.py``): updates apply one instant later, and load demand does not
  lapse at its weights deadline.
- The network send gate (``send_gate.py``): two actions on the wire at once; an infer not sent by its
  latest start less 5 ms fails, reported at its latest start plus its duration.

Departures, besides INFER4's (``infer4/policy.py``): a request a batch would take that has timed out in
the meantime is passed over (the source would run it, its answer already given); loads keep INFER4's
two in flight and 100 us gap, which fbd2f11 dropped and 4786d4e had; a send frees its slot when the
action reaches its worker, not when the socket has written it.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping, Sequence

from mainspring.models.profile import ModelProfile
from mainspring.protocol import ActionResult, ActionStatus, DeviceSpec, Infer, LoadWeights, Request
from mainspring.scheduler.base import Decisions
from mainspring.scheduler.infer4.policy import FUTURE_NS, MAX_LOADS, Infer4Scheduler
from mainspring.scheduler.infer4.state import Infer4Device, QueuedRequest, position_of
from mainspring.scheduler.infer5.send_gate import SEND_SLACK_NS, SendGate
from mainspring.scheduler.infer5.strategies import StrategySet
from mainspring.scheduler.infer5.tracker import TRACKER_LAG_NS, DeferredLoadTracker
from mainspring.scheduler.lanes import NEVER
from mainspring.time import NS_PER_MS

MAX_BATCH = 8  # the controller's max_batch option, as the authors ran it
MAX_EXEC_NS = 250 * NS_PER_MS  # max_allowable_exec_time: larger sizes are never planned
ALL_SIZES = 1 << 30


class Infer5Scheduler(Infer4Scheduler):
    """INFER5 on the ``Scheduler`` contract (see the module's text)."""

    def __init__(
        self,
        profiles: Mapping[str, ModelProfile],
        devices: Sequence[DeviceSpec],
        rng: random.Random | None = None,
        default_slo_ns: int = 100 * NS_PER_MS,
        network_trip_ns: int = 0,
        schedule_ahead_ns: int = 10 * NS_PER_MS,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self.schedule_ahead_ns = self.latest_delta_ns = schedule_ahead_ns
        self.max_batch = max_batch
        self._size_queues: dict[str, dict[int, deque[QueuedRequest]]] = {}
        self._strategy_sets: dict[int, StrategySet] = {}
        self._gate = SendGate(network_trip_ns)  # an action holds a slot for its one-way trip to the worker
        super().__init__(profiles, [], rng, default_slo_ns)
        self.tracker: DeferredLoadTracker = DeferredLoadTracker(default_slo_ns)
        for spec in devices:
            self.add_device(spec)

    # --- the contract ----------------------------------------------------------------------
    def on_request(self, request: Request, now_ns: int) -> None:
        self.tracker.advance(now_ns)
        super().on_request(request, now_ns)
        model = self.models.get(request.model)
        if model is None or not model.queue or model.queue[-1].request is not request:
            return  # answered at once (an unknown model)
        queued = model.queue[-1]
        for queue in self._queues_of(request.model).values():
            queue.append(queued)
        self._activate_everywhere(request.model)

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        self.tracker.advance(now_ns)
        super().on_result(result, now_ns)

    def schedule(self, now_ns: int) -> Decisions:
        """INFER4's pass behind the send gate, after the tracker's updates and the sends that failed."""
        if self.tracker.advance(now_ns):
            self._wants_loads()
        for action in self._gate.failures_due(now_ns):
            message = "could not send action to worker in time"
            super().on_result(ActionResult(action.action_id, action.device, ActionStatus.ERROR, None, message), now_ns)
        decisions = super().schedule(now_ns)
        planned, decisions.actions = decisions.actions, []
        self._gate.release(now_ns, decisions.actions)
        for action in planned:
            send_by, error_at = NEVER, NEVER
            if isinstance(action, Infer):
                send_by = max(action.earliest_ns + FUTURE_NS, action.latest_ns - SEND_SLACK_NS)
                error_at = action.latest_ns + action.expected_duration_ns
            self._gate.send(action, send_by, error_at, now_ns, decisions.actions)
        wakeup = min(NEVER if decisions.wakeup_ns is None else decisions.wakeup_ns, self._gate.next_event_ns())
        if self.tracker.pending and any(d.loads_in_flight < MAX_LOADS for d in self.devices.values()):
            wakeup = min(wakeup, now_ns + TRACKER_LAG_NS)
        decisions.wakeup_ns = None if wakeup == NEVER else wakeup
        return decisions

    # --- membership ------------------------------------------------------------------------
    def add_device(self, spec: DeviceSpec) -> None:
        self._strategy_sets[spec.device] = StrategySet()
        super().add_device(spec)

    def _adopt(self, device: Infer4Device, model: str, pages: int) -> None:
        super()._adopt(device, model, pages)
        self._strategy_sets[device.spec.device].activate(model)

    def remove_device(self, device: int, now_ns: int) -> None:
        self.tracker.advance(now_ns)
        self._gate.forget_device(device)
        super().remove_device(device, now_ns)
        del self._strategy_sets[device]

    def remove_model(self, model: str, now_ns: int) -> None:
        self.tracker.advance(now_ns)
        self._size_queues.pop(model, None)
        for strategies in self._strategy_sets.values():
            strategies.forget(model)
        super().remove_model(model, now_ns)

    def _requeue(self, batch: list[QueuedRequest], reason: str, now_ns: int) -> None:
        super()._requeue(batch, reason, now_ns)
        for name in sorted({q.request.model for q in batch}):  # back in every size's queue, in arrival order
            model = self.models.get(name)
            if model is not None:
                self._size_queues[name] = {size: deque(model.queue) for size in self._sizes(name)}
                self._activate_everywhere(name)

    def _activate_everywhere(self, name: str) -> None:
        """As ``Model::enqueue``: the model's instance on every device, holding it or not."""
        for strategies in self._strategy_sets.values():
            strategies.activate(name)

    # --- queues ----------------------------------------------------------------------------
    def _add_strategies(self, device: Infer4Device, name: str, queued: QueuedRequest) -> None:
        """INFER4's per-request strategies: none here (``StrategySet``)."""

    def _sizes(self, name: str) -> list[int]:
        sizes = self.profiles[name].batch_sizes
        kept = [s for s in sizes if s <= self.max_batch and self.profiles[name].exec_time_ns(s) <= MAX_EXEC_NS]
        return kept or [sizes[0]]

    def _queues_of(self, name: str) -> dict[int, deque[QueuedRequest]]:
        queues = self._size_queues.get(name)
        if queues is None:
            queues = self._size_queues[name] = {size: deque() for size in self._sizes(name)}
        return queues

    # --- inference -------------------------------------------------------------------------
    def _schedule_infers(self, device: Infer4Device, now_ns: int, decisions: Decisions) -> None:
        """As the source's infer threads call ``schedule_infer`` again and again: the models activated
        since are worked out whatever the lane, then one batch per call while the lane frees within the
        schedule-ahead."""
        strategies = self._strategy_sets[device.spec.device]
        for name in strategies.take_activated():
            self._work_out(device, name, ALL_SIZES)
        while max(now_ns + FUTURE_NS, device.exec_lane.free_ns) < now_ns + self.schedule_ahead_ns:
            if not self._schedule_one(device, now_ns, decisions):
                return

    def _schedule_one(self, device: Infer4Device, now_ns: int, decisions: Decisions) -> bool:
        """One ``schedule_infer`` call: the best strategy first; a model that fails keeps sizes below it."""
        free_at = max(now_ns + FUTURE_NS, device.exec_lane.free_ns)
        strategies = self._strategy_sets[device.spec.device]
        while (best := strategies.pop_best()) is not None:
            _, size, name = best
            if name not in device.loaded:
                strategies.deactivate(name)
                continue
            if self._take_batch(device, name, size, free_at, now_ns, decisions):
                self._work_out(device, name, ALL_SIZES)
                return True
            self._work_out(device, name, size - 1)
        return False

    def _work_out(self, device: Infer4Device, name: str, max_size: int) -> None:
        """``add_model_strategies``: (priority, size) of each non-empty queue of ``name`` up to ``max_size``,
        from its front as it stands, timed out or not."""
        found = []
        kind = device.spec.kind
        for size, queue in self._queues_of(name).items():
            if size <= max_size and queue:
                found.append((queue[0].deadline_ns - self.estimator.exec_ns(name, size, kind), size))
        self._strategy_sets[device.spec.device].replace(name, found)

    def _take_batch(
        self, device: Infer4Device, name: str, min_size: int, free_at: int, now_ns: int, decisions: Decisions
    ) -> bool:
        model = self.models[name]
        queues = self._queues_of(name)
        kind = device.spec.kind
        for size, queue in queues.items():
            alive = deque(q for q in queue if position_of(model.queue, q.seq) is not None)
            finish = free_at + self.estimator.exec_ns(name, size, kind)
            while alive and alive[0].deadline_ns < finish:
                alive.popleft()  # not answered: its timeout will
            queues[size] = alive
        sizes = list(queues)
        i = 0
        while i < len(sizes) - 1 and len(queues[sizes[i + 1]]) >= sizes[i + 1]:
            i += 1
        size = sizes[i]
        if size < min_size or len(queues[size]) < size:
            return False
        batch = [queues[size].popleft() for _ in range(size)]
        last = batch[-1].seq
        for queue in queues.values():  # catch up: whatever came before the batch's last is gone from every queue
            while queue and queue[0].seq <= last:
                queue.popleft()
        for queued in batch:
            index = position_of(model.queue, queued.seq)
            assert index is not None
            del model.queue[index]
        exec_ns = self.estimator.exec_ns(name, size, kind)
        self._issue_infer(device, name, batch, free_at, exec_ns, now_ns, decisions)
        return True

    # --- loads -----------------------------------------------------------------------------
    def _load_done(self, action: LoadWeights, result: ActionResult, device: Infer4Device) -> None:
        super()._load_done(action, result, device)
        if result.ok and action.model in device.loaded:
            self._strategy_sets[device.spec.device].activate(action.model)  # ``load_success``: enable new requests

    def _next_wakeup(self, now_ns: int) -> int | None:
        """INFER4's, and a lane coming within the schedule-ahead where strategies wait. A lane within it
        already was tried this pass: nothing there changes before the next request, result, timeout or
        send, each of which is a pass of its own."""
        wakeup = super()._next_wakeup(now_ns)
        best = NEVER if wakeup is None else wakeup
        for device in self.devices.values():
            due = device.exec_lane.free_ns - self.schedule_ahead_ns + 1
            if due > now_ns and self._strategy_sets[device.spec.device]:
                best = min(best, due)
        return None if best == NEVER else best
