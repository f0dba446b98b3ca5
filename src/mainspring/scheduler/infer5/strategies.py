"""One device's INFER5 strategies as the source keeps them (``GPU::strategies``, each ``ModelInstance``'s
own list and ``active`` flag, ``GPU::activated``), which last between decisions.

A model is *activated* on a device when a request arrives for it (on every device, holding it or not) or
its load there ends; activating one already active does nothing. The device works out an activated
model's strategies at its next decision and keeps them, with the priorities of then, until one of them
is tried; trying one removes all of the model's. A model left with no strategy is deactivated, and the
next activation works them out afresh.
"""

from __future__ import annotations

import heapq
from collections import deque

Strategy = tuple[int, int, str]  # priority, batch size, model: the source's order (``StrategyImpl::Comparator``)


class StrategySet:
    """Strategies of the models active on one device, best first, and the models activated since."""

    __slots__ = ("_heap", "_live", "_version", "activated", "active")

    def __init__(self) -> None:
        self.active: set[str] = set()
        self.activated: deque[str] = deque()  # activated, strategies not yet worked out
        self._heap: list[tuple[int, int, str, int]] = []  # (priority, size, model, the model's version)
        self._version: dict[str, int] = {}  # bumped when a model's strategies are removed
        self._live: dict[str, int] = {}  # models with strategies in the set -> how many

    def activate(self, name: str) -> None:
        if name not in self.active:
            self.active.add(name)
            self.activated.append(name)

    def take_activated(self) -> list[str]:
        taken = list(self.activated)
        self.activated.clear()
        return taken

    def replace(self, name: str, strategies: list[tuple[int, int]]) -> None:
        """Set ``name``'s strategies to ``(priority, size)`` each; with none it is deactivated."""
        self._remove(name)
        if not strategies:
            self.active.discard(name)
            return
        version = self._version.get(name, 0)
        for priority, size in strategies:
            heapq.heappush(self._heap, (priority, size, name, version))
        self._live[name] = len(strategies)

    def pop_best(self) -> Strategy | None:
        """The best strategy, after removing every strategy of its model; None if the set is empty."""
        heap = self._heap
        while heap:
            priority, size, name, version = heap[0]
            if self._live.get(name) and version == self._version.get(name, 0):
                self._remove(name)
                return priority, size, name
            heapq.heappop(heap)  # removed earlier
        return None

    def deactivate(self, name: str) -> None:
        self._remove(name)
        self.active.discard(name)

    def forget(self, name: str) -> None:
        """The model left: no strategy, not active, not waiting to be worked out."""
        self.deactivate(name)
        if name in self.activated:
            self.activated = deque(n for n in self.activated if n != name)

    def __bool__(self) -> bool:
        return bool(self._live) or bool(self.activated)

    def _remove(self, name: str) -> None:
        if self._live.pop(name, 0):
            self._version[name] = self._version.get(name, 0) + 1
