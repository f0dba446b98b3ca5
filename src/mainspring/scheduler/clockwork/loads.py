"""Cold starts and replicas: which model to load where, and what to evict for it.

Candidates come in tiers (``Tier``), loaded in that order on every device whose load
lane frees within the horizon (ahead of them all, the tight models ``TightClassGuard`` wants on a
responsive device that lacks them):

1. ``COLD``: queued models held nowhere, the most urgent (weights needed soonest: ``loads_by_need``) first;
   each stands for requests that cannot be served at all without it.
2. ``SPILL``: held models with requests admitted because a new replica could serve them
   in time (``RecentDemand.needs_replica``), the most urgent first.
3. ``TURNED_AWAY``: models held nowhere whose requests were rejected at arrival (they could
   not wait for a load); loaded when memory is idle so later requests find them, busiest first.
4. ``REPLICA``: held models whose demand their holders cannot serve, by load priority
   (demand minus what the holders serve, Clockwork's "demand minus capacity"), checked
   every ``replication_check_ms``.
5. ``WAITED`` (``replicas_by_wait``): held models whose holders turned away requests that a device
   without them had time for (``RecentDemand.record_wait``), the most such requests a second first;
   also every ``replication_check_ms``, one replica at a time, in free memory only.

Demand of a model is the share of a device its recent queued arrivals asked for; a device
asked for more than all of its time serves each of its models proportionally less.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator

from mainspring.scheduler.clockwork.evictions import Evictions
from mainspring.scheduler.clockwork.guard import NoTightClassGuard, TightClassGuard
from mainspring.scheduler.clockwork.state import PolicyState
from mainspring.scheduler.clockwork.tier_order import TierOrder
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.lanes import NEVER
from mainspring.time import ms_to_ns

PlannedLoad = tuple[DeviceState, str, list[str]]  # the device, the model to load there, the models to evict
Tiers = list[tuple["Tier", list[tuple[int, str]]]]  # each tier's (sort key, model) entries, in load order


FULL_MARGIN = 1e-9  # far above the rounding of a sum of device shares taken in another order


class Tier(enum.IntEnum):
    COLD = 0
    SPILL = 1
    TURNED_AWAY = 2
    REPLICA = 3
    WAITED = 4


class LoadPlanner:
    """Plans loads (with the evictions they need) on devices whose load lane is nearly free."""

    def __init__(self, state: PolicyState, evictions: Evictions, guard: TightClassGuard | NoTightClassGuard) -> None:
        self.state = state
        self.config = state.config
        self._evictions = evictions
        self._guard = guard
        state.queue_closed_listeners.append(self.queue_closed)
        self.turned_away: set[str] = set()  # models held nowhere whose requests were rejected
        self._order_key: dict[str, tuple[int, int]] = {}  # model -> (head request, its key in the tiers' order)
        self._last_replication_check_ns = -NEVER
        self._cold = TierOrder(state.residency.cold, state.queues, self._load_order_key)
        self._spill = TierOrder(state.demand.needs_replica, state.queues, self._load_order_key)

    def forget(self, model: str) -> None:
        self.turned_away.discard(model)
        self.queue_closed(model)

    def queue_closed(self, model: str) -> None:
        self._order_key.pop(model, None)
        self._cold.forget(model)
        self._spill.forget(model)

    @property
    def wanted(self) -> bool:
        return bool(self.state.queues or self.turned_away or self._guard.guarding or self.state.demand.waited)

    def plan(self, now_ns: int) -> Iterator[PlannedLoad]:
        """On every device whose load lane frees within the horizon, the model most in need: each load
        (device, model, the models to evict for it) is yielded to be issued before the next is planned,
        as an issued load changes what the next device sees."""
        limit = now_ns + self.config.horizon_ns
        due = self.state.residency.load_due
        if not due.any_due(limit):
            return
        homeless = self._guard.homeless(now_ns)
        tiers, device_load = self._candidates(now_ns, lambda: due.due(limit))
        if not homeless and not any(entries for _, entries in tiers):
            return  # the common pass: nothing to load, and the free devices never listed
        free = due.due(limit)
        free.sort(key=lambda d: d.load_lane.free_ns)
        issued: dict[Tier, set[str]] = {}  # per tier, the models loaded this pass (a model may stand in two tiers)
        for device in free:
            home = self._guard_home(device, homeless, now_ns) if homeless else None
            if home is not None:
                i, model, victims = home
                yield device, model, victims
                homeless[i] = (model, homeless[i][1] - {device.spec.device})
                continue
            found = self._load_one(device, tiers, issued, device_load, now_ns)
            if found is not None:
                tier, model, victims = found
                yield device, model, victims
                self.state.demand.needs_replica.discard(model)
                self.state.demand.replica_placed(model)
                issued.setdefault(tier, set()).add(model)

    def _guard_home(
        self, device: DeviceState, homeless: list[tuple[str, frozenset[int]]], now_ns: int
    ) -> tuple[int, str, list[str]] | None:
        """The tight model (``TightClassGuard``) to load on ``device``, if it is a responsive device
        without one, with its place in ``homeless`` and its victims: ahead of every tier, as each tight
        request that finds no responsive holder may wait behind a full batch. Only while the tight
        models take at most half the device's pages, and evicting only models that are neither queued
        nor tight (the guard's loads never evict one another)."""
        tight = self._guard.plan(now_ns).tight.keys()
        if 2 * sum(self.state.pages_on(model, device) for model in tight) > device.spec.total_pages:
            return None
        for i, (model, missing) in enumerate(homeless):
            if device.spec.device not in missing or device.holds(model):
                continue
            victims = self._evictions.victims(device, model, idle_only=True, now_ns=now_ns)
            if victims is None or any(victim in tight for victim in victims):
                continue
            return i, model, victims
        return None

    def _load_one(
        self,
        device: DeviceState,
        tiers: Tiers,
        issued: dict[Tier, set[str]],
        device_load: dict[int, float],
        now_ns: int,
    ) -> tuple[Tier, str, list[str]] | None:
        """The first candidate, in load order, that ``device`` can take, with its tier and victims."""
        for tier, entries in tiers:
            taken = issued.get(tier, ())
            for _, model in entries:  # mostly held by the device or unable to help: read in place, not copied
                if device.holds(model) or model in taken:
                    continue
                if tier is Tier.REPLICA and device_load.get(device.spec.device, 0.0) >= 1.0:
                    continue
                if tier is Tier.WAITED:  # for later requests, not the queued ones; never evicts
                    if device.free_pages >= self.state.pages_on(model, device):
                        return tier, model, []
                    continue
                queued = model in self.state.queues
                if queued and not self._can_help(device, model, now_ns):
                    continue
                idle_only = tier in (Tier.TURNED_AWAY, Tier.REPLICA) or not queued
                victims = self._evictions.victims(device, model, idle_only=idle_only, now_ns=now_ns)
                if victims is None:
                    continue
                return tier, model, victims
        return None

    def _candidates(self, now_ns: int, free: Callable[[], list[DeviceState]]) -> tuple[Tiers, dict[int, float]]:
        """Every model worth loading on the devices ``free`` lists, tier by tier in load order, and the
        demand on each device (for replicas; only then are the devices listed)."""
        tiers = self._urgent()
        kind = self.state.residency.kinds[0]
        turned_away = sorted((-int(1e9 * self.state.demand.model_demand(m, now_ns, kind)), m) for m in self.turned_away)
        tiers.append((Tier.TURNED_AWAY, turned_away))
        device_load: dict[int, float] = {}
        if len(self.state.residency.devices) == 1:
            return tiers, device_load  # a replica needs a second device: no demand to weigh
        if now_ns - self._last_replication_check_ns >= ms_to_ns(self.config.replication_check_ms):
            self._last_replication_check_ns = now_ns
            waited = self._waited(now_ns) if self.config.replicas_by_wait else None
            if self._replica_room(free(), now_ns):
                priorities, device_load = self.load_priorities(now_ns)
                threshold = self.config.replica_min_demand
                holders = self.state.residency.holders
                ranked = sorted((-p, m) for m, p in priorities.items() if p >= threshold and m in holders)
                tiers.append((Tier.REPLICA, [(rank, model) for rank, (_, model) in enumerate(ranked)]))
            if waited:
                tiers.append((Tier.WAITED, waited))
        return tiers, device_load

    def _waited(self, now_ns: int) -> list[tuple[int, str]]:
        """The ``WAITED`` tier: held models whose holders turned away at least ``replica_min_waits_per_s``
        requests a second that a device without them had time for, the most first; not while a replica
        of the model is loading (its effect on the waits is not seen yet)."""
        residency = self.state.residency
        waits = self.state.demand.waits_at_least(self.config.replica_min_waits_per_s, now_ns)
        ranked = sorted(
            (-share, model)
            for model, share in waits.items()
            if model in residency.holders and not any(model in d.loading for d in residency.holding(model))
        )
        return [(rank, model) for rank, (_, model) in enumerate(ranked)]

    def _urgent(self) -> Tiers:
        """The ``COLD`` and ``SPILL`` tiers, in load order (``TierOrder``'s lists themselves: nothing
        changes them until the next call)."""
        head_moved = self.state.queues.head_moved
        self._cold.update(head_moved)
        self._spill.update(head_moved)
        head_moved.clear()
        return [(Tier.COLD, self._cold.order), (Tier.SPILL, self._spill.order)]

    def _load_order_key(self, model: str) -> int:
        """When the weights of ``model`` must be in place to serve its most urgent request (on the
        fastest kind), or with ``loads_by_need`` off the latest start of a load that still does.
        Cached per head request: the tiers are ordered by it (``TierOrder``)."""
        head = self.state.queues[model].head()
        if head is None:
            return NEVER
        cached = self._order_key.get(model)
        if cached is not None and cached[0] == head.id:
            return cached[1]
        shapes, kinds = self.state.shapes, self.state.residency.kinds
        if self.config.loads_by_need:
            need = min(shapes.fastest_ns(model, k) for k in kinds)
        else:
            need = min(shapes.estimator.load_ns(model, k) + shapes.fastest_ns(model, k) for k in kinds)
        key = head.ready_by_ns - need
        self._order_key[model] = (head.id, key)
        return key

    # --- replicas -------------------------------------------------------------------------------
    def load_priorities(self, now_ns: int) -> tuple[dict[str, float], dict[int, float]]:
        """Per queued model: its recent demand (share of a device its arrivals asked for)
        minus what the devices holding it can give it; and the demand on each device.

        A device asked for more than all of its time (demand above 1.0) serves each of
        its models proportionally less, so their priorities turn positive.
        """
        residency = self.state.residency
        device_load = {d.spec.device: d.demand.value(now_ns) for d in residency.devices}
        kind = residency.kinds[0]
        models = self.state.queues.models()
        wanted = self.state.demand.model_demands(models, now_ns, kind)
        priorities = self._minus_served(wanted, device_load)
        if self.config.queue_demand:
            queued = {model: self.queue_demand(model, now_ns) for model in models}
            queue_load: dict[int, float] = {}
            for model, demand in queued.items():
                holders = residency.holders.get(model, ())
                for device_id in holders:
                    queue_load[device_id] = queue_load.get(device_id, 0.0) + demand / len(holders)
            for model, p in self._minus_served(queued, queue_load).items():
                priorities[model] = max(priorities[model], p)
            device_load = {d: max(load, queue_load.get(d, 0.0)) for d, load in device_load.items()}
        return priorities, device_load

    def _replica_room(self, free: list[DeviceState], now_ns: int) -> bool:
        """Could any of the ``free`` devices take a replica? Not one whose demand (``load_priorities``'
        device load) is at least all of it: then the check over every queued model (a few ms
        each 10 ms at 32 devices) is skipped, as its replicas would be. A device's queued demand
        is summed in another order than there, hence the margin: skipped only when surely full."""
        for device in free:
            if device.demand.value(now_ns) >= 1.0:
                continue
            if not self.config.queue_demand:
                return True
            holders = self.state.residency.holders
            queued = sum(self.queue_demand(model, now_ns) / len(holders[model]) for model in device.waiting)
            if queued < 1.0 + FULL_MARGIN:
                return True
        return False

    def _minus_served(self, wanted: dict[str, float], device_load: dict[int, float]) -> dict[str, float]:
        priorities = {}
        all_holders = self.state.residency.holders
        for model, demand in wanted.items():
            holders = all_holders.get(model, ())
            if len(holders) == 1:  # most models: the sum of one term, without the generator
                (holder,) = holders
                priorities[model] = demand - demand / max(1.0, device_load.get(holder, 0.0))
                continue
            served = sum(demand / len(holders) / max(1.0, device_load.get(d, 0.0)) for d in holders)
            priorities[model] = demand - served
        return priorities

    def queue_demand(self, model: str, now_ns: int) -> float:
        """Share of one device the queued requests of a model need before their deadlines."""
        queue = self.state.queues[model]
        head = queue.head()
        if head is None:
            return 0.0
        batch = self.state.shapes.padded(model, min(queue.count, self.state.shapes.sizes(model)[-1]))
        kind = self.state.residency.kinds[0]
        per_request = self.state.shapes.exec_ns(model, batch, kind) / batch
        slack = max((head.ready_by_ns + queue.max_ready_by_ns) / 2 - now_ns, per_request)
        return queue.count * per_request / slack

    # --- placement ------------------------------------------------------------------------------
    def _can_help(self, device: DeviceState, model: str, now_ns: int) -> bool:
        """Would a load started now on ``device`` finish in time for any queued request?"""
        estimator = self.state.shapes.estimator
        ready = max(now_ns, device.load_lane.free_ns) + estimator.load_ns(model, device.kind)
        start = max(ready, device.exec_lane.free_ns)
        finish = start + self.state.shapes.fastest_ns(model, device.kind)
        return finish <= self.state.queues[model].max_ready_by_ns
