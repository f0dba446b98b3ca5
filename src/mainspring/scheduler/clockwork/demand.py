"""Recent demand: arrivals per model, the share of each device they ask for, and the models only a
new replica can serve. Admission, the batch planner, the load planner and the tight-class guard
read it (``PolicyState.demand``); the policy records each arrival."""

from __future__ import annotations

from mainspring.scheduler.clockwork.config import ClockworkConfig
from mainspring.scheduler.clockwork.cost_shares import CostShares
from mainspring.scheduler.clockwork.residency import Residency
from mainspring.scheduler.clockwork.shapes import BatchShapes
from mainspring.scheduler.clockwork.tier_order import WatchedSet
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.estimator import DecayingRate
from mainspring.time import NS_PER_S, ms_to_ns


class RecentDemand:
    """What recent arrivals asked of the devices, per model and per device, decayed over
    ``rate_memory_ms`` (and over ``popularity_memory_ms`` for evictions)."""

    def __init__(self, config: ClockworkConfig, residency: Residency, judged: BatchShapes) -> None:
        self.config = config
        self._residency = residency
        self._shapes = judged  # admission's estimates: what demand is measured in
        self._memory_ns = ms_to_ns(config.rate_memory_ms)
        self._arrivals: dict[str, DecayingRate] = {}  # per model: requests per unit of memory
        self._popularity: dict[str, DecayingRate] = {}  # the same over ``popularity_memory_ms`` (evictions)
        self._popularity_ns = ms_to_ns(config.popularity_memory_ms)
        self._counts_popularity = False  # from when a pool fills (``pool_filled``)
        self.needs_replica = WatchedSet()  # held models with requests only a new replica can serve
        # per model: requests its holders turned away that another device had time for
        self._turned_from_holders: dict[str, DecayingRate] = {}
        # shares by the batch a model's rate fills (``share_by_cost``)
        self.by_cost = CostShares(config, residency, judged, self.arrivals_per_ns) if config.share_by_cost else None

    def forget(self, model: str) -> None:
        self._arrivals.pop(model, None)
        self._popularity.pop(model, None)
        self.needs_replica.discard(model)
        self._turned_from_holders.pop(model, None)
        if self.by_cost is not None:
            self.by_cost.forget(model)

    def record(self, model: str, slo_ns: int, now_ns: int) -> None:
        """Remember an arrival of ``model`` (with ``slo_ns``) and the device time it asks of each holder."""
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
        if self.by_cost is not None:
            self.by_cost.record(model, slo_ns, now_ns)

    def record_wait(self, model: str, now_ns: int) -> None:
        """Remember that ``model``'s holders turned away a request that a device without it had time
        for (``replicas_by_wait``)."""
        waited = self._turned_from_holders.get(model)
        if waited is None:
            waited = self._turned_from_holders[model] = DecayingRate(self._memory_ns)
        waited.add(NS_PER_S, now_ns)  # read as requests per second

    @property
    def waited(self) -> bool:
        """Are turned-away requests (``record_wait``) still remembered for some model?"""
        return bool(self._turned_from_holders)

    def waits_at_least(self, per_s: float, now_ns: int) -> dict[str, float]:
        """The models whose holders recently turned away at least ``per_s`` requests a second that
        another device had time for (``record_wait``), with that rate; models whose rate decayed below
        a hundredth of it are forgotten."""
        found = {}
        for model, waited in list(self._turned_from_holders.items()):
            value = waited.value(now_ns)
            if value >= per_s:
                found[model] = value
            elif value < per_s / 100:
                del self._turned_from_holders[model]
        return found

    def replica_placed(self, model: str) -> None:
        """A replica of ``model`` is on its way: the evidence against its former holders is spent."""
        self._turned_from_holders.pop(model, None)

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

    def demand_on(self, model: str, device: DeviceState, now_ns: int) -> float:
        """Share of ``device`` that ``model``'s recent arrivals asked of it (spread over its holders)."""
        return self.model_demand(model, now_ns, device.kind) / len(self._residency.holders[model])

    def share_given(self, own: float, device: DeviceState, now_ns: int) -> float:
        """The share of ``device`` left to a model whose own demand on it is ``own``."""
        return max(self.config.min_share, 1.0 - (device.demand.value(now_ns) - own))

    def over_share(self, model: str, device: DeviceState, now_ns: int) -> bool:
        """Does ``model`` ask more of ``device`` than the other models' demand leaves it?"""
        if not self._residency.holders.get(model):
            return False
        if self.by_cost is not None:
            return self.by_cost.over_share(model, device, now_ns)
        own = self.demand_on(model, device, now_ns)
        return own > self.share_given(own, device, now_ns)
