"""Admission: recent demand per model and device, and the decision to queue or reject a request at once.

A request is queued when some device can finish it by its deadline (the policy took the deadline
margin off at arrival): a device holding its model, after the work queued there that is due no later (at
the least lane time its batches can take: a lower bound), or another device after loading
the model. When only a new replica could serve it, the model is marked for one
(``RecentDemand.needs_replica``) and the load planner places it. A model asking more of its holders than
the other models leave it may queue only its share of their time (``share_admission``),
unless a replica could take the excess: a burst is moved onto idle capacity first, refused
only when none has room.
"""

from __future__ import annotations

from typing import NamedTuple

from mainspring.protocol import Request
from mainspring.protocol.model_names import client_name
from mainspring.scheduler.clockwork.cost_shares import water_level
from mainspring.scheduler.clockwork.evictions import Evictions
from mainspring.scheduler.clockwork.state import PolicyState
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.lanes import NEVER
from mainspring.time import ms_to_ns, ns_to_ms

PROTECT_CACHE_NS = ms_to_ns(1)  # how long a device's fair water level is reused


class Refusal(NamedTuple):
    """Why a request is rejected at arrival; ``overloaded``: for its model's share, not its deadline."""

    reason: str
    overloaded: bool


class Admission:
    """Decides, at arrival, whether a request is queued (the demand of arrivals is ``RecentDemand``'s)."""

    def __init__(self, state: PolicyState, evictions: Evictions) -> None:
        self.state = state
        self.config = state.config
        self._shapes = state.judged  # its own estimates with ``admission_percentile_cpu``
        self._evictions = evictions  # a replica counts only where idle models make room
        # per device: (the millisecond it was computed in, models below the fair water level)
        self._protected: dict[int, tuple[int, set[str]]] = {}

    # --- the decision -------------------------------------------------------------------------
    def rejection(self, request: Request, now_ns: int) -> Refusal | None:
        """Why ``request`` must be rejected now, or None to queue it."""
        model = request.model
        finish_by = request.ready_by_ns
        held = self.state.residency.holding(model)
        on_holder = min((self._completion_on(d, request, now_ns) for d in held), default=NEVER)
        if on_holder <= finish_by and (not self.config.share_admission or self._within_share(request, now_ns)):
            return None
        if self.config.replicas_by_wait and held and on_holder > finish_by:
            self._note_wait(request, now_ns)
        on_new = self._completion_after_load(request, now_ns, finish_by, needs_room=bool(held))
        if on_new <= finish_by:
            if held:
                self.state.demand.needs_replica.add(model)
            return None
        if on_holder <= finish_by:
            name = client_name(model)
            reason = f"overloaded: requests queued for {name} already fill its share of the devices until the deadline"
            return Refusal(reason, overloaded=True)
        need = ns_to_ms(min(on_holder, on_new) - request.arrival_ns)
        slo = ns_to_ms(request.slo_ns)
        reason = f"deadline cannot be met: earliest completion {need:.2f} ms after arrival, SLO {slo:.2f} ms"
        return Refusal(reason, overloaded=False)

    def _completion_on(self, device: DeviceState, request: Request, now_ns: int) -> int:
        """When ``request`` could finish on a holder: after the lane frees and the weights are ready,
        after the work queued there that is due no later, at the least lane time its batches can take
        (``BatchShapes.work_ns``: a lower bound)."""
        model, kind = request.model, device.kind
        start = max(now_ns, device.exec_lane.free_ns, device.ready_ns[model])
        queue = self.state.queues.get(model)
        if queue is not None and request.ready_by_ns >= queue.max_ready_by_ns:
            holders = len(self.state.residency.holders[model])
            own = self._shapes.work_ns(model, queue.count + 1, kind) // holders
        else:
            own = self._shapes.fastest_ns(model, kind)
        return start + own + (self._work_ahead(device, request) if self.config.device_admission else 0)

    def _work_ahead(self, device: DeviceState, request: Request) -> int:
        """Exec time the other models queued on ``device`` need before ``request``'s deadline."""
        work = 0
        for other in device.waiting:
            if other == request.model:
                continue
            queue = self.state.queues[other]
            head = queue.head()
            if head is None or head.ready_by_ns > request.ready_by_ns:
                continue
            work += self._shapes.work_ns(other, queue.count, device.kind) // len(self.state.residency.holders[other])
        return work

    def _note_wait(self, request: Request, now_ns: int) -> None:
        """``request`` cannot finish in time on its model's holders: if a device without the model has a
        lane free in time for it, its holders' queues made it wait, and it counts towards a replica
        (``replicas_by_wait``)."""
        model = request.model
        for device in self.state.residency.devices:
            if model in device.ready_ns:
                continue
            start = max(now_ns, device.exec_lane.free_ns)
            if start + self._shapes.fastest_ns(model, device.kind) <= request.ready_by_ns:
                self.state.demand.record_wait(model, now_ns)
                return

    def _completion_after_load(self, request: Request, now_ns: int, finish_by_ns: int, needs_room: bool) -> int:
        """Best finish on a device not holding the model, after loading it. A replica
        (``needs_room``) counts only where idle models make room; that is checked only for
        devices fast enough to matter (the check walks the device's models)."""
        model = request.model
        best = NEVER
        estimator = self._shapes.estimator
        for device in self.state.residency.devices:
            if model in device.ready_ns:
                continue
            ready = max(now_ns, device.load_lane.free_ns) + estimator.load_ns(model, device.kind)
            start = max(ready, device.exec_lane.free_ns)
            if self.config.device_admission:
                start += self._work_ahead(device, request)
            finish = start + self._shapes.fastest_ns(model, device.kind)
            if finish <= finish_by_ns and needs_room and self._evictions.victims(device, model, idle_only=True) is None:
                continue
            best = min(best, finish)
        return best

    def _within_share(self, request: Request, now_ns: int) -> bool:
        if self.state.demand.by_cost is not None:
            return self._within_cost_share(request, now_ns)
        return self._within_batch1_share(request, now_ns)

    def _within_cost_share(self, request: Request, now_ns: int) -> bool:
        """``share_by_cost`` (``CostShares``): a model whose entry (its own, or the flood's) asks more
        of its holders than the fair level, while another entry there asks for less, is admitted at
        its entry's share of their time (the flood: at what the entries of their own leave it)."""
        by_cost = self.state.demand.by_cost
        assert by_cost is not None
        queue = self.state.queues.get(request.model)
        queued = queue.count if queue is not None else 0
        held = self.state.residency.holding(request.model)
        return by_cost.admits(request.model, queued, held, request.deadline_ns, now_ns)

    def _within_batch1_share(self, request: Request, now_ns: int) -> bool:
        """A model whose recent demand exceeds its share of its holders (what the other models'
        demand leaves it, at least ``min_share``) may queue only as much work as that share
        of their time until this request's deadline. Models within their share pass."""
        model, recent = request.model, self.state.demand
        held = self.state.residency.holding(model)
        own: list[float] = []  # its demand on each holder: the same on every holder of a kind
        by_kind: dict[str, float] = {}
        for d in held:
            demand = by_kind.get(d.kind)
            if demand is None:
                demand = by_kind[d.kind] = recent.demand_on(model, d, now_ns)
            own.append(demand)
        if not any(o > recent.share_given(o, d, now_ns) for o, d in zip(own, held, strict=True)):
            return True
        if self.config.share_protects_only and not any(self._protects(model, d, now_ns) for d in held):
            return True  # every model on its holders is over its fair share: none to protect
        queue = self.state.queues.get(model)
        count = 1 + (queue.count if queue is not None else 0)
        covered = 0.0  # share of the queued work the holders' shares of time cover until the deadline
        for o, d in zip(own, held, strict=True):
            room = max(0, request.ready_by_ns - max(now_ns, d.exec_lane.free_ns)) * recent.share_given(o, d, now_ns)
            if self.config.share_full_batch:
                room = max(room, self._shapes.work_ns(model, self._shapes.sizes(model)[-1], d.kind))
            covered += room / max(1, self._shapes.work_ns(model, count, d.kind))
        return covered >= 1.0

    def _protects(self, model: str, device: DeviceState, now_ns: int) -> bool:
        """Does another model on ``device`` ask for less than its max-min fair share of it (the
        water level where the demands, each capped at it, fill the device)? Such a model is what
        share admission protects; when every model asks for more (three hot models that batch),
        holding each to its share only refuses work the device would serve."""
        cached = self._protected.get(device.spec.device)
        if cached is None or cached[0] != now_ns // PROTECT_CACHE_NS:
            recent = self.state.demand
            demands = [(recent.demand_on(held, device, now_ns), held) for held in device.ready_ns]
            demands = [(demand, held) for demand, held in demands if demand > 0.0]
            level = water_level([d for d, _ in demands])
            cached = (now_ns // PROTECT_CACHE_NS, {m for d, m in demands if d < level})
            self._protected[device.spec.device] = cached
        below = cached[1]
        return len(below) > (model in below)
