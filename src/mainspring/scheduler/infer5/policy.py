"""Clockwork's INFER5 scheduler, the one the authors ran for Figs. 5-8 and 11 (INFER4, ``infer4/``, ran
Figs. 9-10). It follows ``controller/infer5/infer5_scheduler.cpp`` at fbd2f11 of the authors' repository
(mirrored as ``malixian/clockwork``) and keeps INFER4's request deadlines, load tracker and load lane.

How it differs from INFER4:

- Queues: each model keeps one FIFO per supported batch size, every request in each. Before a batch is
  taken, each queue drops from its front the requests that could not finish at its size if the batch
  started when the lane frees (they are not answered then: only their timeout answers them).
- Strategies: per model loaded on a device, one per non-empty queue, with priority ``front's deadline
  - estimate(size)``, ordered by priority, then the smaller size, then the model; a large batch's longer
  estimate moves it ahead.
- A strategy of size ``b`` runs the largest size ``s`` whose queue, and every smaller size's before it,
  holds ``s`` requests, if ``s >= b``; the other queues catch up past the requests taken. A model whose
  strategy fails is tried again only with sizes below ``b`` in that pass.
- Batches of at most 8 (``max_batch``) and no size estimated above 250 ms; the schedule-ahead (10 ms;
  the authors passed 5 ms for Figs. 7, 8 and 11) is also each action's latest delta.

Departures, besides INFER4's (``infer4/policy.py``): each device's strategies are worked out afresh at
every decision (the source keeps a model's strategies from when the model was last activated, so their
priorities may lag the queues); the source's network send gate (two actions in flight on the wire, an
action not sent by its latest start less 5 ms fails) is not modelled, as the simulator's network is
instant; loads keep INFER4's two in flight and 100 us gap, which fbd2f11 dropped and 4786d4e had.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Mapping, Sequence

from mainspring.models.profile import ModelProfile
from mainspring.protocol import DeviceSpec, Request
from mainspring.scheduler.base import Decisions
from mainspring.scheduler.infer4.policy import FUTURE_NS, Infer4Scheduler
from mainspring.scheduler.infer4.state import Infer4Device, QueuedRequest, position_of
from mainspring.scheduler.lanes import NEVER
from mainspring.time import NS_PER_MS

MAX_BATCH = 8  # the controller's max_batch option, as the authors ran it
MAX_EXEC_NS = 250 * NS_PER_MS  # max_allowable_exec_time: larger sizes are never planned


class Infer5Scheduler(Infer4Scheduler):
    """INFER5 on the ``Scheduler`` contract (see the module's text)."""

    def __init__(
        self,
        profiles: Mapping[str, ModelProfile],
        devices: Sequence[DeviceSpec],
        rng: random.Random | None = None,
        default_slo_ns: int = 100 * NS_PER_MS,
        schedule_ahead_ns: int = 10 * NS_PER_MS,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self.schedule_ahead_ns = self.latest_delta_ns = schedule_ahead_ns
        self.max_batch = max_batch
        self._size_queues: dict[str, dict[int, deque[QueuedRequest]]] = {}
        self._waiting: set[str] = set()  # models with requests queued (some may have emptied since)
        self._waiting_now: list[str] = []  # this pass's, in name order (``schedule``)
        super().__init__(profiles, devices, rng, default_slo_ns)

    # --- requests ------------------------------------------------------------------------
    def on_request(self, request: Request, now_ns: int) -> None:
        super().on_request(request, now_ns)
        model = self.models.get(request.model)
        if model is None or not model.queue or model.queue[-1].request is not request:
            return  # answered at once (an unknown model)
        queued = model.queue[-1]
        for queue in self._queues_of(request.model).values():
            queue.append(queued)
        self._waiting.add(request.model)

    def _add_strategies(self, device: Infer4Device, name: str, queued: QueuedRequest) -> None:
        """Strategies come from the queues at each decision (``_schedule_infers``)."""

    def _sizes(self, name: str) -> list[int]:
        sizes = self.profiles[name].batch_sizes
        kept = [s for s in sizes if s <= self.max_batch and self.profiles[name].exec_time_ns(s) <= MAX_EXEC_NS]
        return kept or [sizes[0]]

    def _queues_of(self, name: str) -> dict[int, deque[QueuedRequest]]:
        queues = self._size_queues.get(name)
        if queues is None:
            queues = self._size_queues[name] = {size: deque() for size in self._sizes(name)}
        return queues

    def _requeue(self, batch: list[QueuedRequest], reason: str, now_ns: int) -> None:
        super()._requeue(batch, reason, now_ns)
        for name in {q.request.model for q in batch}:  # back in every size's queue, in arrival order
            model = self.models.get(name)
            if model is not None:
                self._size_queues[name] = {size: deque(model.queue) for size in self._sizes(name)}
                self._waiting.add(name)

    def remove_model(self, model: str, now_ns: int) -> None:
        self._size_queues.pop(model, None)
        self._waiting.discard(model)
        super().remove_model(model, now_ns)

    # --- inference -------------------------------------------------------------------------
    def schedule(self, now_ns: int) -> Decisions:
        """INFER4's pass, with the models that have requests worked out once for it (none arrive
        during a pass; one that empties has no strategy)."""
        self._waiting_now = self._waiting_models()
        return super().schedule(now_ns)

    def _schedule_infers(self, device: Infer4Device, now_ns: int, decisions: Decisions) -> None:
        """As the source's infer threads call ``schedule_infer`` again and again: one batch per call, while
        the lane frees within the schedule-ahead."""
        while max(now_ns + FUTURE_NS, device.exec_lane.free_ns) < now_ns + self.schedule_ahead_ns:
            if not self._schedule_one(device, now_ns, decisions):
                return

    def _schedule_one(self, device: Infer4Device, now_ns: int, decisions: Decisions) -> bool:
        free_at = max(now_ns + FUTURE_NS, device.exec_lane.free_ns)
        names = [name for name in self._waiting_now if name in device.loaded]
        heap = [s for name in names for s in self._strategies(device, name, self.max_batch, 0)]
        heapq.heapify(heap)
        version = dict.fromkeys(names, 0)
        while heap:
            _, size, name, made = heapq.heappop(heap)
            if made != version[name]:
                continue  # the model's strategies were replaced since
            if self._take_batch(device, name, size, free_at, now_ns, decisions):
                return True
            version[name] += 1  # the source removes all of the model's strategies and adds those below ``size``
            for strategy in self._strategies(device, name, size - 1, version[name]):
                heapq.heappush(heap, strategy)
        return False

    def _waiting_models(self) -> list[str]:
        """Models with requests queued, in name order (the source's model ids order its ties)."""
        models = self.models
        self._waiting = {name for name in self._waiting if name in models and models[name].queue}
        return sorted(self._waiting)

    def _strategies(
        self, device: Infer4Device, name: str, max_size: int, version: int
    ) -> list[tuple[int, int, str, int]]:
        """(priority, size, model, ``version``) of each non-empty queue of ``name`` up to ``max_size``."""
        found = []
        kind = device.spec.kind
        for size, queue in self._queues_of(name).items():
            front = self._front(name, queue)
            if size <= max_size and front is not None:
                priority = front.deadline_ns - self.estimator.exec_ns(name, size, kind)
                found.append((priority, size, name, version))
        return found

    def _front(self, name: str, queue: deque[QueuedRequest]) -> QueuedRequest | None:
        """The queue's first request still waiting (answered ones, by timeout, leave lazily)."""
        model = self.models.get(name)
        while queue and (model is None or position_of(model.queue, queue[0].seq) is None):
            queue.popleft()
        return queue[0] if queue else None

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

    def _next_wakeup(self, now_ns: int) -> int | None:
        """INFER4's, and a lane coming within the schedule-ahead where a loaded model has requests. A lane
        within it already was tried this pass: nothing there changes before the next request, result
        or timeout, each of which is a pass of its own."""
        wakeup = super()._next_wakeup(now_ns)
        best = NEVER if wakeup is None else wakeup
        waiting = self._waiting_models()  # after the pass: some emptied
        for device in self.devices.values():
            due = device.exec_lane.free_ns - self.schedule_ahead_ns + 1
            if due > now_ns and any(name in device.loaded for name in waiting):
                best = min(best, due)
        return None if best == NEVER else best
