"""Cold starts: which model to load where, and what to evict for it.

Demand of a model is the share of a device its recent arrivals asked for (a
decaying sum of their batch-1 work; rejected requests count too, so a model
throttled by admission still shows its need). Each device holding the model serves
part of that demand; a device asked for more than all of its time serves every
model proportionally less. Load priority = demand - what the holders serve
(Clockwork's "demand minus capacity", comparing values, not pointers). Cold models
(queued, held nowhere) are loaded first, the most urgent first; a positive priority
above ``replica_min_demand`` earns a hot model a replica.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mainspring.scheduler.base import Decisions
from mainspring.scheduler.clockwork.tracker import NEVER, DeviceState
from mainspring.time import ms_to_ns

if TYPE_CHECKING:
    from mainspring.scheduler.clockwork.policy import ClockworkScheduler


def plan_loads(s: ClockworkScheduler, now_ns: int, decisions: Decisions) -> None:
    """On every device whose load lane frees within the horizon, load the model most in need.

    Cold models (held nowhere) come first, the most urgent first: each stands for
    requests that cannot be served at all without it. Replicas of hot models follow,
    by load priority, checked every ``replication_check_ms``.
    """
    limit = now_ns + s.horizon_ns
    free = [d for d in s.devices if d.load_lane.free_ns <= limit]
    if not free:
        return
    candidates = sorted((_latest_load_start(s, model), model) for model in s.cold)
    # Models whose requests could not wait for a load: loaded when memory is idle, busiest first.
    candidates += sorted((NEVER - int(1e9 * s.model_demand(m, now_ns)), m) for m in s.turned_away)
    device_load: dict[int, float] = {}
    if now_ns - s.last_replication_check_ns >= ms_to_ns(s.config.replication_check_ms):
        s.last_replication_check_ns = now_ns
        priorities, device_load = load_priorities(s, now_ns)
        threshold = s.config.replica_min_demand
        replicas = sorted((-p, m) for m, p in priorities.items() if p >= threshold and m in s.holders)
        candidates += [(NEVER, model) for _, model in replicas]
    if not candidates:
        return
    free.sort(key=lambda d: d.load_lane.free_ns)
    for device in free:
        for index, (_, model) in enumerate(candidates):
            replica = model in s.holders
            prefetch = model not in s.queues
            if device.holds(model) or (replica and device_load.get(device.spec.device, 0.0) >= 1.0):
                continue
            if not prefetch and not _can_help(s, device, model, now_ns):
                continue
            victims = eviction_victims(s, device, model, idle_only=replica or prefetch)
            if victims is None:
                continue
            s.issue_load(device, model, victims, now_ns, decisions)
            del candidates[index]
            break


def _latest_load_start(s: ClockworkScheduler, model: str) -> int:
    """Latest time a load of ``model`` may start and still serve its most urgent request.

    Cached per head request: the order of cold loads is recomputed on every pass."""
    head = s.queues[model].head()
    if head is None:
        return NEVER
    cached = s.latest_load_start.get(model)
    if cached is not None and cached[0] == head.id:
        return cached[1]
    kind = s.devices[0].kind
    latest = head.deadline_ns - s.estimator.load_ns(model, kind) - s.fastest_ns(model, kind)
    s.latest_load_start[model] = (head.id, latest)
    return latest


def load_priorities(s: ClockworkScheduler, now_ns: int) -> tuple[dict[str, float], dict[int, float]]:
    """Per queued model: its recent demand (share of a device its arrivals asked for)
    minus what the devices holding it can give it; and the demand on each device.

    A device asked for more than all of its time (demand above 1.0) serves each of
    its models proportionally less, so their priorities turn positive.
    """
    device_load = {d.spec.device: d.demand.value(now_ns) for d in s.devices}
    wanted = {model: s.model_demand(model, now_ns) for model in s.queues}
    priorities = _minus_served(s, wanted, device_load)
    if s.config.queue_demand:
        queued = {model: queue_demand(s, model, now_ns) for model in s.queues}
        queue_load: dict[int, float] = {}
        for model, demand in queued.items():
            holders = s.holders.get(model, ())
            for device_id in holders:
                queue_load[device_id] = queue_load.get(device_id, 0.0) + demand / len(holders)
        for model, p in _minus_served(s, queued, queue_load).items():
            priorities[model] = max(priorities[model], p)
        device_load = {d: max(load, queue_load.get(d, 0.0)) for d, load in device_load.items()}
    return priorities, device_load


def _minus_served(s: ClockworkScheduler, wanted: dict[str, float], device_load: dict[int, float]) -> dict[str, float]:
    priorities = {}
    for model, demand in wanted.items():
        holders = s.holders.get(model, ())
        served = sum(demand / len(holders) / max(1.0, device_load.get(d, 0.0)) for d in holders)
        priorities[model] = demand - served
    return priorities


def queue_demand(s: ClockworkScheduler, model: str, now_ns: int) -> float:
    """Share of one device the queued requests of a model need before their deadlines."""
    queue = s.queues[model]
    head = queue.head()
    if head is None:
        return 0.0
    batch = s.padded(model, min(queue.count, s.batch_sizes(model)[-1]))
    per_request = s.estimator.exec_ns(model, batch, s.devices[0].kind) / batch
    slack = max((head.deadline_ns + queue.max_deadline_ns) / 2 - now_ns, per_request)
    return queue.count * per_request / slack


def _can_help(s: ClockworkScheduler, device: DeviceState, model: str, now_ns: int) -> bool:
    """Would a load started now on ``device`` finish in time for any queued request?"""
    ready = max(now_ns, device.load_lane.free_ns) + s.estimator.load_ns(model, device.kind)
    start = max(ready, device.exec_lane.free_ns)
    smallest = s.batch_sizes(model)[0]
    return start + s.estimator.exec_ns(model, smallest, device.kind) <= s.queues[model].max_deadline_ns


def eviction_victims(
    s: ClockworkScheduler, device: DeviceState, model: str, idle_only: bool = False
) -> list[str] | None:
    """Models to evict so that ``model`` fits: least recently used without queued demand
    first, then (unless ``idle_only``) least recently used; never one with work in
    flight. None if impossible."""
    need = s.pages_of(model, device.spec)
    if device.free_pages >= need:
        return []
    if need > device.spec.total_pages:
        return None
    freed = device.free_pages
    victims: list[str] = []
    for idle_pass in (True,) if idle_only else (True, False):
        for held in device.last_used:
            if freed >= need:
                return victims
            if held in device.pinned or held in victims or (idle_pass and held in s.queues):
                continue
            victims.append(held)
            freed += s.pages_of(held, device.spec)
    return victims if freed >= need else None
