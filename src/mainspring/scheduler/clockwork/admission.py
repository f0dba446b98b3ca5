"""Admission: recent demand per model and device, and the decision to queue or reject a request at once.

A request is queued when some device can finish it by its deadline (the policy took the deadline
margin off at arrival): a device holding its model, after the work queued there that is due no later (at
the least lane time its batches can take: a lower bound), or another device after loading
the model. When only a new replica could serve it, the model is marked for one
(``needs_replica``) and the load planner places it. A model asking more of its holders than
the other models leave it may queue only its share of their time (``share_admission``),
unless a replica could take the excess: a burst is moved onto idle capacity first, refused
only when none has room.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from mainspring.protocol import Request
from mainspring.scheduler.clockwork.config import ClockworkConfig
from mainspring.scheduler.clockwork.estimator import DecayingRate
from mainspring.scheduler.clockwork.queues import RequestQueues
from mainspring.scheduler.clockwork.residency import Residency
from mainspring.scheduler.clockwork.shapes import BatchShapes
from mainspring.scheduler.clockwork.tier_order import WatchedSet
from mainspring.scheduler.clockwork.tracker import NEVER, DeviceState
from mainspring.time import ms_to_ns, ns_to_ms

VictimFinder = Callable[[DeviceState, str], "list[str] | None"]
PROTECT_CACHE_NS = ms_to_ns(1)  # how long a device's fair water level is reused


def water_level(demands: list[float]) -> float:
    """The max-min fair share of one device among ``demands`` (shares of it): the level at which
    the demands, each capped there, add up to the whole device; infinite when they all fit."""
    if sum(demands) <= 1.0:
        return float("inf")
    left, count = 1.0, len(demands)
    for demand in sorted(demands):
        if demand * count > left:
            return left / count
        left -= demand
        count -= 1
    return left  # not reached: the demands sum to more than 1


class Refusal(NamedTuple):
    """Why a request is rejected at arrival; ``overloaded``: for its model's share, not its deadline."""

    reason: str
    overloaded: bool


class Admission:
    """Decides, at arrival, whether a request is queued; remembers the demand of arrivals."""

    def __init__(
        self,
        config: ClockworkConfig,
        residency: Residency,
        queues: RequestQueues,
        shapes: BatchShapes,
        idle_victims: VictimFinder,
    ) -> None:
        self.config = config
        self._residency = residency
        self._queues = queues
        self._shapes = shapes
        self._idle_victims = idle_victims  # models a device could evict, idle ones only, to take a model
        self._memory_ns = ms_to_ns(config.rate_memory_ms)
        self._arrivals: dict[str, DecayingRate] = {}  # per model: requests per unit of memory
        self._popularity: dict[str, DecayingRate] = {}  # the same over ``popularity_memory_ms`` (evictions)
        self._popularity_ns = ms_to_ns(config.popularity_memory_ms)
        self._counts_popularity = False  # from when a pool fills (``pool_filled``)
        self.needs_replica = WatchedSet()  # held models with requests only a new replica can serve
        # per device: (the millisecond it was computed in, models below the fair water level)
        self._protected: dict[int, tuple[int, set[str]]] = {}

    def forget(self, model: str) -> None:
        self._arrivals.pop(model, None)
        self._popularity.pop(model, None)
        self.needs_replica.discard(model)

    # --- demand ----------------------------------------------------------------------------
    def record(self, model: str, now_ns: int) -> None:
        """Remember an arrival of ``model`` and the device time it asks of each holder."""
        rate = self._arrivals.get(model)
        if rate is None:
            rate = self._arrivals[model] = DecayingRate(self._memory_ns)
        rate.add(1.0, now_ns)
        if self._counts_popularity:
            popular = self._popularity.get(model)
            if popular is None:
                popular = self._popularity[model] = DecayingRate(self._popularity_ns)
            popular.add(1.0, now_ns)
        holders = self._residency.holding(model)
        for device in holders:
            device.demand.add(self._shapes.fastest_ns(model, device.kind) / len(holders), now_ns)

    def pool_filled(self) -> None:
        """A device's pool is full: from now on evictions weigh popularity, so count arrivals. With
        room for every model nothing evicts, and counting every arrival measured 1.4% more policy
        instructions."""
        self._counts_popularity = self.config.evict_by_popularity

    def popularity(self, model: str, now_ns: int) -> float:
        """``model``'s recent arrivals, decayed over ``popularity_memory_ms`` (0 if it has none)."""
        rate = self._popularity.get(model)
        return 0.0 if rate is None else rate.value(now_ns)

    def arrivals_per_ns(self, model: str, now_ns: int) -> float:
        """``model``'s recent arrival rate, decayed over ``rate_memory_ms``."""
        rate = self._arrivals.get(model)
        return 0.0 if rate is None else rate.value(now_ns)

    def model_demand(self, model: str, now_ns: int, kind: str) -> float:
        """Share of one device of ``kind`` that ``model``'s recent arrivals asked for."""
        rate = self._arrivals.get(model)
        return 0.0 if rate is None else rate.value(now_ns) * self._shapes.fastest_ns(model, kind)

    def model_demands(self, models: list[str], now_ns: int, kind: str) -> dict[str, float]:
        """``model_demand`` of each of ``models`` (the replica check asks it of every queued model)."""
        arrivals, fastest_ns = self._arrivals, self._shapes.fastest_ns
        demands = {}
        for model in models:
            rate = arrivals.get(model)
            demands[model] = 0.0 if rate is None else rate.value(now_ns) * fastest_ns(model, kind)
        return demands

    # --- the decision -------------------------------------------------------------------------
    def rejection(self, request: Request, now_ns: int) -> Refusal | None:
        """Why ``request`` must be rejected now, or None to queue it."""
        model = request.model
        finish_by = request.deadline_ns
        held = self._residency.holding(model)
        on_holder = min((self._completion_on(d, request, now_ns) for d in held), default=NEVER)
        if on_holder <= finish_by and (not self.config.share_admission or self._within_share(request, now_ns)):
            return None
        on_new = self._completion_after_load(request, now_ns, finish_by, needs_room=bool(held))
        if on_new <= finish_by:
            if held:
                self.needs_replica.add(model)
            return None
        if on_holder <= finish_by:
            reason = f"overloaded: requests queued for {model} already fill its share of the devices until the deadline"
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
        queue = self._queues.get(model)
        if queue is not None and request.deadline_ns >= queue.max_deadline_ns:
            holders = len(self._residency.holders[model])
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
            queue = self._queues[other]
            head = queue.head()
            if head is None or head.deadline_ns > request.deadline_ns:
                continue
            work += self._shapes.work_ns(other, queue.count, device.kind) // len(self._residency.holders[other])
        return work

    def _completion_after_load(self, request: Request, now_ns: int, finish_by_ns: int, needs_room: bool) -> int:
        """Best finish on a device not holding the model, after loading it. A replica
        (``needs_room``) counts only where idle models make room; that is checked only for
        devices fast enough to matter (the check walks the device's models)."""
        model = request.model
        best = NEVER
        estimator = self._shapes.estimator
        for device in self._residency.devices:
            if model in device.ready_ns:
                continue
            ready = max(now_ns, device.load_lane.free_ns) + estimator.load_ns(model, device.kind)
            start = max(ready, device.exec_lane.free_ns)
            if self.config.device_admission:
                start += self._work_ahead(device, request)
            finish = start + self._shapes.fastest_ns(model, device.kind)
            if finish <= finish_by_ns and needs_room and self._idle_victims(device, model) is None:
                continue
            best = min(best, finish)
        return best

    def _within_share(self, request: Request, now_ns: int) -> bool:
        """A model whose recent demand exceeds its share of its holders (what the other models'
        demand leaves it, at least ``min_share``) may queue only as much work as that share
        of their time until this request's deadline. Models within their share pass."""
        model = request.model
        held = self._residency.holding(model)
        own: list[float] = []  # its demand on each holder: the same on every holder of a kind
        by_kind: dict[str, float] = {}
        for d in held:
            demand = by_kind.get(d.kind)
            if demand is None:
                demand = by_kind[d.kind] = self._demand_on(model, d, now_ns)
            own.append(demand)
        if not any(o > self._share_given(o, d, now_ns) for o, d in zip(own, held, strict=True)):
            return True
        if self.config.share_protects_only and not any(self._protects(model, d, now_ns) for d in held):
            return True  # every model on its holders is over its fair share: none to protect
        queue = self._queues.get(model)
        count = 1 + (queue.count if queue is not None else 0)
        covered = 0.0  # share of the queued work the holders' shares of time cover until the deadline
        for o, d in zip(own, held, strict=True):
            room = max(0, request.deadline_ns - max(now_ns, d.exec_lane.free_ns)) * self._share_given(o, d, now_ns)
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
            demands = [(self._demand_on(held, device, now_ns), held) for held in device.ready_ns]
            demands = [(demand, held) for demand, held in demands if demand > 0.0]
            level = water_level([d for d, _ in demands])
            cached = (now_ns // PROTECT_CACHE_NS, {m for d, m in demands if d < level})
            self._protected[device.spec.device] = cached
        below = cached[1]
        return len(below) > (model in below)

    def _demand_on(self, model: str, device: DeviceState, now_ns: int) -> float:
        """Share of ``device`` that ``model``'s recent arrivals asked of it (spread over its holders)."""
        return self.model_demand(model, now_ns, device.kind) / len(self._residency.holders[model])

    def _share_given(self, own: float, device: DeviceState, now_ns: int) -> float:
        """The share of ``device`` left to a model whose own demand on it is ``own``."""
        return max(self.config.min_share, 1.0 - (device.demand.value(now_ns) - own))

    def over_share(self, model: str, device: DeviceState, now_ns: int) -> bool:
        """Does ``model`` ask more of ``device`` than the other models' demand leaves it?"""
        if not self._residency.holders.get(model):
            return False
        own = self._demand_on(model, device, now_ns)
        return own > self._share_given(own, device, now_ns)
