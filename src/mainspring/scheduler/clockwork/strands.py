"""Stranded requests ask for a replica: the check the policy runs on every pass (``spill_after``).

A request that has waited ``spill_after`` of its SLO behind other models' batches on a busy
holder marks its model for a new replica (``RecentDemand.needs_replica``); the load planner places
it on a device with an idle lane, if in time. Models whose replicas on the way already cover
their queue are set aside (``SettledStrands``) until that could change.
"""

from __future__ import annotations

from mainspring.protocol import Request
from mainspring.scheduler.clockwork.queues import ModelQueue
from mainspring.scheduler.clockwork.settled import SettledStrands
from mainspring.scheduler.clockwork.state import PolicyState
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.lanes import NEVER


class StrandCheck:
    """The stranded models, the ones still to check, and the ones set aside."""

    def __init__(self, state: PolicyState) -> None:
        self.state = state
        self._needs_replica = state.demand.needs_replica
        self.stranded: set[str] = set()  # models whose oldest request waited past ``spill_after``
        self._active: set[str] = set()  # of those, the ones to check (``spill``)
        self._settled = SettledStrands()  # stranded models replicas on the way cover, until that could change

    def spill(self, now_ns: int, after: float) -> None:
        """A request that has waited ``after`` of its SLO behind other models' batches on a busy
        holder asks for a new replica: a device with an idle lane loads its model (if in time).
        Checked on every pass (every ``replication_check_ms`` instead raised the Azure x30 window
        from 2 to 1,196 misses), but only for models with such a request: a heap of strand times
        finds them, so the cost does not grow with the devices' waiting models."""
        stranded, active, settled = self.stranded, self._active, self._settled
        needs_replica, cold = self._needs_replica, self.state.residency.cold
        # Skipped until that changes: models waiting for their replica, cold ones (no holder to be
        # stranded behind; their load is planned anyway), and ones the replicas on the way cover.
        # ``active`` holds the rest (and some of those, dropped when reached; kept by ``take_changes``):
        # taking the difference of the sets on every pass cost as much as the checks (hundreds of
        # parked models at 150 devices).
        for model in self.state.queues.newly_stranded(now_ns):
            stranded.add(model)
            active.add(model)
        for model in list(active):
            if model in needs_replica or model in cold or model in settled.models:
                active.discard(model)
                continue
            queue = self.state.queues.get(model)
            head = None if queue is None else queue.head()
            if queue is None or head is None or now_ns - head.arrival_ns <= after * head.slo_ns:
                stranded.discard(model)  # its stranded requests left; later ones have their own strand time
                active.discard(model)
                continue
            holders = self.state.residency.holding(model)
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
                room += self.state.shapes.largest_batch_by(model, device.kind, max(now_ns, free_ns), head.ready_by_ns)
                counted.append(device.spec.device)
                until = min(until, free_ns)
                if room >= count:
                    if until >= now_ns:
                        self._settled.settle(model, until, tuple(counted))
                    return True
        return False

    def take_changes(self, now_ns: int) -> None:
        """Hand what changed since the last pass to ``SettledStrands`` and to the strand check."""
        queues, residency, settled = self.state.queues, self.state.residency, self._settled
        if settled.models:
            settled.unsettle(queues.changed)
            settled.unsettle(residency.changed)
            settled.lanes_moved(residency.exec_moved)
            settled.expire(now_ns)
        queues.changed.clear()
        residency.changed.clear()
        residency.exec_moved.clear()
        # Stranded models that stopped waiting for a replica, stopped being cold or were set free
        # are checked again (``spill``).
        for released in (self._needs_replica.released, residency.cold.released, settled.released):
            if released:
                if self.stranded:
                    self._active.update(released.intersection(self.stranded))
                released.clear()

    def estimates_changed(self, kind: str, model: str | None) -> None:
        """An ``Estimator`` watcher: models whose estimates moved are checked again."""
        if model is None:
            self._settled.clear()  # the kind's ratio moved: every model's estimates may have
        else:
            self._settled.unsettle((model,))
