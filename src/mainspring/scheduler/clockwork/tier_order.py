"""A tier of load candidates (cold models, models that need a replica) kept in load order as it
changes, instead of sorted on every pass.

The load planner takes these models by the latest possible start of a load that still serves
their most urgent request (then by name). Computing every member's key on every pass cost a queue
lookup per model per pass: at 32 overloaded devices, 150 models a pass. A model's key changes
only with its head request (the planner caches the key per head), so here a sorted list of
(key, model) is updated from what changed since the last pass: the members that joined or left
(``WatchedSet``) and the models whose head request changed (``RequestQueues.head_moved``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

from mainspring.scheduler.clockwork.queues import RequestQueues


class WatchedSet(set[str]):
    """A set of models that remembers which joined and which left since its reader (``TierOrder``)
    last cleared ``joined`` and ``left``; and, for a second reader (the policy's strand check), which
    left since it cleared ``released``. Only ``add`` and ``discard`` may change it."""

    def __init__(self) -> None:
        super().__init__()
        self.joined: set[str] = set()
        self.left: set[str] = set()
        self.released: set[str] = set()

    def add(self, model: str) -> None:
        if model not in self:
            super().add(model)
            self.joined.add(model)
            self.left.discard(model)

    def discard(self, model: object) -> None:
        if isinstance(model, str) and model in self:
            super().discard(model)
            self.left.add(model)
            self.released.add(model)
            self.joined.discard(model)


class TierOrder:
    """The queued models of ``members``, ordered by ``key`` (then name). ``key`` caches per head
    request, so it is asked again only for models whose head changed."""

    def __init__(self, members: WatchedSet, queues: RequestQueues, key: Callable[[str], int]) -> None:
        self._members = members
        self._queues = queues
        self._key = key
        self.order: list[tuple[int, str]] = []  # (key, model), sorted
        self._placed: dict[str, int] = {}  # model -> its key in ``order``

    def forget(self, model: str) -> None:
        key = self._placed.pop(model, None)
        if key is not None:
            del self.order[bisect.bisect_left(self.order, (key, model))]

    def update(self, head_moved: Iterable[str]) -> None:
        """Bring the order up to date: drop the members that left, place the ones that joined or whose
        head request changed at their key."""
        members = self._members
        for model in members.left:
            self.forget(model)
        moved = members.joined.union(head_moved)
        members.joined.clear()
        members.left.clear()
        queues, placed = self._queues, self._placed
        for model in moved:
            if model not in members or model not in queues:
                self.forget(model)
                continue
            key = self._key(model)
            if placed.get(model) != key:
                self.forget(model)
                placed[model] = key
                bisect.insort(self.order, (key, model))
