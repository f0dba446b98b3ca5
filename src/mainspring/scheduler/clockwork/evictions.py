"""What a device evicts to take a model: the least recently used of the models it may give up, by
popularity where ``evict_by_popularity`` is set, never one with work in flight."""

from __future__ import annotations

from mainspring.scheduler.clockwork.state import PolicyState
from mainspring.scheduler.clockwork.tracker import DeviceState

# Evictions weigh popularity among this many least recently used candidates: bounded work per
# eviction where a device holds hundreds of models (a V100); a smaller pool is weighed whole.
EVICTION_SAMPLE = 32


class Evictions:
    """Chooses the models a device evicts to take another (for the load planner, and for admission,
    which counts a device as able to take a replica only where idle models make room)."""

    def __init__(self, state: PolicyState) -> None:
        self.state = state

    def victims(
        self, device: DeviceState, model: str, idle_only: bool = False, now_ns: int | None = None
    ) -> list[str] | None:
        """Models to evict so that ``model`` fits: ones without queued demand first, then (unless
        ``idle_only``) any; never one with work in flight. Within each, the least recently used
        first; given ``now_ns`` (and ``evict_by_popularity``), the least popular of the
        ``EVICTION_SAMPLE`` least recently used first. None if impossible."""
        need = self.state.pages_on(model, device)
        if device.free_pages >= need:
            return []
        if need > device.spec.total_pages:
            return None
        freed = device.free_pages
        victims: list[str] = []
        self.state.demand.pool_filled()
        at = now_ns if self.state.config.evict_by_popularity else None
        sample = 0 if at is None else EVICTION_SAMPLE
        for idle_pass in (True,) if idle_only else (True, False):
            candidates = self._evictable(device, idle_pass, victims, need - freed, sample)
            if at is not None:
                popularity = self.state.demand.popularity
                candidates.sort(key=lambda held: popularity(held, at))  # stable: ties stay in LRU order
            for held in candidates:
                if freed >= need:
                    return victims
                victims.append(held)
                freed += self.state.pages_on(held, device)
        return victims if freed >= need else None

    def _evictable(self, device: DeviceState, idle_only: bool, taken: list[str], need: int, at_least: int) -> list[str]:
        """Models ``device`` may evict, least recently used first, until they free ``need`` pages and
        number ``at_least``."""
        found: list[str] = []
        pages = 0
        for held in device.last_used:
            if pages >= need and len(found) >= at_least:
                break
            if held in device.pinned or held in taken or (idle_only and held in self.state.queues):
                continue
            held_pages = self.state.pages_on(held, device)
            if not held_pages:  # a model without weights: evicting it frees nothing
                continue
            found.append(held)
            pages += held_pages
        return found
