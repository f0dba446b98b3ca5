"""Shares past saturation by what each model's rate really costs (``share_by_cost``, off by default).

A model's demand is weighed at the batch its rate fills in half its SLO (capped at the largest batch;
the cost per request of that batch, from the estimates), not at batch 1: a model at 200 r/s with a
100 ms SLO runs batches of 10 and asks 0.35 of a V100, not the 0.66 a batch of one per request costs.

Max-min fairness over models cannot keep a steady model whole while hundreds of models each ask for a
sliver: the fair level falls to one over their count. So the level is computed over *entries*. Once
some model has asked for ``share_steady_after_ms``, a model is an entry of its own only if it too has
asked that long and its rate fills a batch of two within its SLO; every other model on the device (the
new ones, and slivers whose requests each run alone) is part of one entry, the flood. The flood may
use what the entries of their own, capped at the level, leave it; an entry of its own at the level
is held to its share while another asks for less. Both are held by a bound on the rate of admitted
work (``admits``), whatever the number of models. Before any model has asked that long (the start of
a run), every model is an entry of its own.

The tight class (the tight-class guard's, ``guard.py``) is an entry of its own whatever its batches
cost and is never held: its SLO makes it run in batches of about one, so weighed at its batches' cost
beside batch clients (cheap per request in batches of 16) it is the entry over the level, and held;
the guard, not the share, keeps devices responsive for it (Fig. 8).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from mainspring.scheduler.clockwork.config import ClockworkConfig
from mainspring.scheduler.clockwork.residency import Residency
from mainspring.scheduler.clockwork.shapes import BatchShapes
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.estimator import DecayingRate
from mainspring.time import ms_to_ns

VIEW_CACHE_NS = ms_to_ns(100)  # how long a device's entries and level are reused (rates are remembered over 1 s)


class _DeviceShares:
    """One device's flood (recent and admitted work) and its models with entries of their own."""

    __slots__ = ("below", "capped", "computed_at", "flood", "flood_now", "free_ns", "incumbents", "level", "own")

    def __init__(self, memory_ns: int) -> None:
        self.flood = DecayingRate(memory_ns)  # work the flood's arrivals asked for, at their batches' cost
        self.free_ns: dict[str, int] = {}  # per entry held to its share: when its admitted work ends, run at that share
        self.own: dict[str, float] = {}  # models with an entry of their own -> their demand (as computed)
        self.computed_at = -1  # the view's time, in ``VIEW_CACHE_NS``
        self.incumbents = False  # a model with an entry of its own has asked steadily then
        self.flood_now = 0.0  # the flood's demand then
        self.level = float("inf")  # the fair level over the entries then
        self.below = 0  # entries below the level
        self.capped = 0.0  # the entries' demands, each capped at the level


FLOOD = ""  # the flood's name among the entries (no model is named "")


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


class CostShares:
    """Per model and device: demand at the batch the model's rate fills, entries, the fair level."""

    def __init__(
        self,
        config: ClockworkConfig,
        residency: Residency,
        judged: BatchShapes,
        arrivals_per_ns: Callable[[str, int], float],
    ) -> None:
        self.config = config
        self._residency = residency
        self._shapes = judged
        self._arrivals_per_ns = arrivals_per_ns
        self._memory_ns = ms_to_ns(config.rate_memory_ms)
        self._steady_after_ns = ms_to_ns(config.share_steady_after_ms)
        self._slo_ns: dict[str, int] = {}  # per model: its latest request's SLO
        self._since_ns: dict[str, int] = {}  # per model: when its current run of arrivals began
        self._last_ns: dict[str, int] = {}  # per model: its latest arrival
        self._devices: dict[int, _DeviceShares] = {}
        self._short_since: dict[str, int] = {}  # per model with an entry: since when its rate fills no batch of two
        self._grace_ns = 2 * self._memory_ns
        self._tight: Callable[[int], Collection[str]] = lambda now_ns: ()  # the guard's tight models

    def follow_guard(self, tight: Callable[[int], Collection[str]]) -> None:
        """Read the tight class from ``tight`` (the guard's plan at a time)."""
        self._tight = tight

    def forget(self, model: str) -> None:
        for table in (self._slo_ns, self._since_ns, self._last_ns, self._short_since):
            table.pop(model, None)
        for shares in self._devices.values():
            shares.own.pop(model, None)
            shares.free_ns.pop(model, None)

    def _of(self, device: DeviceState) -> _DeviceShares:
        shares = self._devices.get(device.spec.device)
        if shares is None:
            shares = self._devices[device.spec.device] = _DeviceShares(self._memory_ns)
        return shares

    # --- demand -------------------------------------------------------------------------------
    def price_ns(self, model: str, kind: str, per_holder_per_ns: float, at_least: int = 1) -> float:
        """Lane time per request at the batch ``model``'s rate on one holder fills in half its SLO (a
        batch gathers for at most half and runs in the other half), or of ``at_least`` requests."""
        sizes = self._shapes.sizes(model)
        count = min(sizes[-1], max(at_least, int(per_holder_per_ns * self._slo_ns.get(model, 0) / 2)))
        return self._shapes.work_ns(model, count, kind) / count

    def demand_on(self, model: str, device: DeviceState, now_ns: int) -> float:
        """Share of ``device`` that ``model``'s recent arrivals ask of it, at their batches' cost; at
        batch-1 cost up to ``min_share`` (what a model may always fill), so that a small model's
        requests need never wait for a batch to fill."""
        holders = len(self._residency.holders.get(model, ())) or 1
        rate = self._arrivals_per_ns(model, now_ns) / holders
        alone = rate * self._shapes.fastest_ns(model, device.kind)
        return max(rate * self.price_ns(model, device.kind, rate), min(self.config.min_share, alone))

    def _fills_batches(self, model: str, now_ns: int, kept: bool = False) -> bool:
        """Does ``model``'s rate on one holder fill a batch of two within its SLO (not a sliver)? One that
        has an entry (``kept``) keeps it until its rate has fallen short for two rate memories on end: a
        rate measured over a second wanders, and three steady models at 23 r/s each (2.3 requests an
        SLO) fell in and out of the flood, held at its share while they were in it. (Kept instead while
        its rate filled one request an SLO, Fig. 6's minor lost 0.1% once memory was full, it seems to
        majors whose rates fall through two as more become active.)"""
        holders = len(self._residency.holders.get(model, ())) or 1
        sizes = self._shapes.sizes(model)
        smallest_batch = sizes[1] if len(sizes) > 1 else 2
        fills = self._arrivals_per_ns(model, now_ns) / holders * self._slo_ns.get(model, 0) >= smallest_batch
        if fills or not kept:
            self._short_since.pop(model, None)
            return fills
        return now_ns - self._short_since.setdefault(model, now_ns) < self._grace_ns

    def _steady(self, model: str, now_ns: int) -> bool:
        since = self._since_ns.get(model)
        return since is not None and now_ns - since >= self._steady_after_ns

    def _has_own_entry(self, model: str, incumbents: bool, now_ns: int, kept: bool = False) -> bool:
        """Beside ``incumbents`` (models with entries that are steady): steady and not a sliver, or tight.
        With none (at the start of a run every model is as old as the others), every model."""
        if not incumbents or model in self._tight(now_ns):
            return True
        return self._fills_batches(model, now_ns, kept) and self._steady(model, now_ns)

    def _incumbents(self, shares: _DeviceShares, now_ns: int) -> bool:
        return any(self._steady(model, now_ns) for model in shares.own)

    def record(self, model: str, slo_ns: int, now_ns: int) -> None:
        """An arrival of ``model`` (its rate already counted): its share of the flood, or its own entry."""
        last = self._last_ns.get(model)
        if last is None or now_ns - last > self._steady_after_ns:
            self._since_ns[model] = now_ns  # a model back after a long gap starts over
        self._last_ns[model] = now_ns
        self._slo_ns[model] = slo_ns
        holders = self._residency.holding(model)
        if not holders:
            return
        rate = self._arrivals_per_ns(model, now_ns) / len(holders)
        for device in holders:
            shares = self._of(device)
            if model in shares.own or self._has_own_entry(model, self._view(device, now_ns).incumbents, now_ns):
                shares.own[model] = 0.0  # computed with the view
            else:
                shares.flood.add(self.price_ns(model, device.kind, rate) / len(holders), now_ns)

    # --- the fair level -----------------------------------------------------------------------
    def _view(self, device: DeviceState, now_ns: int) -> _DeviceShares:
        """``device``'s entries and their fair level, computed again every ``VIEW_CACHE_NS``."""
        shares = self._of(device)
        if shares.computed_at == now_ns // VIEW_CACHE_NS:
            return shares
        shares.computed_at = now_ns // VIEW_CACHE_NS
        shares.incumbents = incumbents = self._incumbents(shares, now_ns)
        for model in list(shares.own):
            demand = self.demand_on(model, device, now_ns) if device.holds(model) else 0.0
            if demand <= 0.0 or not self._has_own_entry(model, incumbents, now_ns, kept=True):
                del shares.own[model]
            else:
                shares.own[model] = demand
        self._level(shares, now_ns)
        return shares

    def _level(self, shares: _DeviceShares, now_ns: int) -> None:
        """The fair level over the entries, how many are below it and their demands capped at it."""
        demands = list(shares.own.values())
        flood = shares.flood.value(now_ns)
        shares.flood_now = flood
        if flood > 0.0:
            demands.append(flood)
        shares.level = level = water_level(demands)
        shares.below = sum(demand < level for demand in demands)
        shares.capped = sum(min(demand, level) for demand in demands)

    def own_entry(
        self, model: str, device: DeviceState, now_ns: int, queued: int = 0
    ) -> tuple[float, float, bool] | None:
        """``model``'s own entry on ``device`` (None: it is in the flood): its demand, its share (the
        fair level, or what the others capped at it leave, at least ``min_share``), and whether it is
        at the level while another entry there asks for less (one to protect). Its own demand is read
        now, at least its ``queued`` requests' work within their SLO: a burst's rate, remembered over a
        second, shows only after its queue does; a demand that grew since the view was computed
        computes the level again."""
        shares = self._view(device, now_ns)
        cached = shares.own.get(model)
        if cached is None:
            return None
        demand = self.demand_on(model, device, now_ns)
        slo_ns = self._slo_ns.get(model, 0)
        if queued and slo_ns:
            holders = len(self._residency.holders.get(model, ())) or 1
            demand = max(demand, self._shapes.work_ns(model, queued, device.kind) / holders / slo_ns)
        if demand > 1.1 * cached + 0.001:
            shares.own[model] = cached = demand
            self._level(shares, now_ns)
        level = shares.level
        protects = demand >= level and shares.below - (cached < level) > 0
        left = 1.0 - (shares.capped - min(cached, level))  # what the others, capped at the level, leave
        return demand, max(self.config.min_share, left, level if level < 1.0 else 0.0), protects

    def _flood_share(self, shares: _DeviceShares) -> float:
        """What the entries of their own, each capped at the fair level, leave the flood."""
        return max(self.config.min_share, 1.0 - (shares.capped - min(shares.flood_now, shares.level)))

    def over_share(self, model: str, device: DeviceState, now_ns: int) -> bool:
        """Does ``model``'s entry ask more of ``device`` than its share? (A tight model never does.)"""
        if model in self._tight(now_ns):
            return False
        own = self.own_entry(model, device, now_ns)
        if own is None:
            shares = self._view(device, now_ns)
            return shares.flood.value(now_ns) > self._flood_share(shares)
        return own[0] > own[1]

    def admits(self, model: str, queued: int, holders: Sequence[DeviceState], finish_by_ns: int, now_ns: int) -> bool:
        """A request of ``model``, whose entry on its holders is over its share while another entry there
        asks for less than the fair level (or, for the flood, while entries of their own are held):
        admitted when its entry's admitted work, run at the entry's share of some holder, would end by
        ``finish_by_ns``; then counted there. A bound on the rate of admitted work, not only on the
        queued work: the lane drains a queue as fast as it admits. It is priced at its batch's cost:
        the batch its model's rate fills, or its ``queued`` requests and it, whichever is larger. A tight
        model is admitted by its deadline alone."""
        if model in self._tight(now_ns):
            return True
        rate = self._arrivals_per_ns(model, now_ns) / len(holders)
        ends = []
        for device in holders:
            shares = self._view(device, now_ns)
            own = self.own_entry(model, device, now_ns, queued + 1)
            if own is None:
                name, share, protects = FLOOD, self._flood_share(shares), bool(shares.own)
                start = max(now_ns, shares.free_ns.get(FLOOD, 0))
            else:
                (_, share, protects), name = own, model
                # its queue is work admitted before it was held, not yet run
                queued_ns = self._shapes.work_ns(model, queued, device.kind) / len(holders)
                start = max(now_ns + int(queued_ns / share), shares.free_ns.get(model, 0))
            if not protects:
                return True  # nothing on this holder to protect from it
            work = self.price_ns(model, device.kind, rate, queued + 1) / share
            ends.append((start + int(work), name, device))
        end, name, device = min(ends, key=lambda entry: entry[0])
        if end > finish_by_ns:
            return False
        self._of(device).free_ns[name] = end
        return True
