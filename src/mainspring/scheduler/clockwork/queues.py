"""Per-model request queues, earliest deadline first, and the expiry of what can no longer make it."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from mainspring.protocol import Request


class ModelQueue:
    """Requests for one model ordered by deadline. Entries whose request left the
    shared ``live`` map (rejected on expiry) are skipped when reached."""

    __slots__ = ("_changed", "_heap", "_live", "_moved", "count", "max_ready_by_ns", "model")

    def __init__(self, model: str, live: dict[int, Request], moved: set[str], changed: set[str]) -> None:
        self.model = model
        self._heap: list[tuple[int, int]] = []
        self._live = live
        self._moved = moved  # models whose head may have changed (``RequestQueues.head_moved``)
        self._changed = changed  # models whose queue changed at all (``RequestQueues.changed``)
        self.count = 0
        self.max_ready_by_ns = 0

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.ready_by_ns, request.id))
        if self._heap[0][1] == request.id:
            self._moved.add(self.model)
        self._changed.add(self.model)
        self._live[request.id] = request
        self.count += 1
        self.max_ready_by_ns = max(self.max_ready_by_ns, request.ready_by_ns)

    def head(self) -> Request | None:
        heap, live = self._heap, self._live
        while heap:
            request = live.get(heap[0][1])
            if request is not None:
                return request
            heapq.heappop(heap)
        return None

    def pop(self) -> Request:
        request = self.head()
        if request is None:
            raise IndexError(f"queue of {self.model} is empty")
        heapq.heappop(self._heap)
        del self._live[request.id]
        self.count -= 1
        self._moved.add(self.model)
        self._changed.add(self.model)
        return request

    def requests(self) -> list[Request]:
        """Every queued request, in no particular order."""
        live = self._live
        return [live[i] for _, i in self._heap if i in live]

    def forget(self, request_id: int) -> None:
        """The request left the queue by another way (its entry is skipped later)."""
        del self._live[request_id]
        self.count -= 1
        self._moved.add(self.model)
        self._changed.add(self.model)


class RequestQueues:
    """Every model's queue and two heaps: a request *expires* at the last moment its fastest
    batch could still start on any device, and is *stranded* once it has waited a set share
    of its SLO (both times set by the policy when it is queued)."""

    def __init__(self) -> None:
        self._queues: dict[str, ModelQueue] = {}
        self._live: dict[int, Request] = {}
        self._expiry: list[tuple[int, int, str]] = []
        self._strands: list[tuple[int, int, str]] = []
        self.head_moved: set[str] = set()  # models whose head request may have changed; the reader clears it
        self.changed: set[str] = set()  # models whose queue changed (a request came or left); the policy clears it

    def __contains__(self, model: object) -> bool:
        return model in self._queues

    def __bool__(self) -> bool:
        return bool(self._queues)

    def get(self, model: str) -> ModelQueue | None:
        return self._queues.get(model)

    def __getitem__(self, model: str) -> ModelQueue:
        return self._queues[model]

    def models(self) -> list[str]:
        return list(self._queues)

    def push(self, request: Request, expires_ns: int, strands_ns: int | None = None) -> bool:
        """Queue ``request``; True if its model had no queue before."""
        queue = self._queues.get(request.model)
        opened = queue is None
        if queue is None:
            queue = self._queues[request.model] = ModelQueue(request.model, self._live, self.head_moved, self.changed)
        queue.push(request)
        heapq.heappush(self._expiry, (expires_ns, request.id, request.model))
        if strands_ns is not None:
            heapq.heappush(self._strands, (strands_ns, request.id, request.model))
        return opened

    def newly_stranded(self, now_ns: int) -> Iterator[str]:
        """The models of queued requests whose strand time has come since the last call."""
        strands, live = self._strands, self._live
        while strands and strands[0][0] <= now_ns:
            _, request_id, model = heapq.heappop(strands)
            if request_id in live:
                yield model

    def expired(self, now_ns: int) -> Iterator[Request]:
        """Take out every queued request whose expiry has come."""
        expiry = self._expiry
        while expiry and expiry[0][0] <= now_ns:
            _, request_id, model = heapq.heappop(expiry)
            request = self._live.get(request_id)
            if request is not None:
                self._queues[model].forget(request_id)
                yield request

    def next_expiry_ns(self) -> int | None:
        expiry = self._expiry
        while expiry and expiry[0][1] not in self._live:
            heapq.heappop(expiry)
        return expiry[0][0] if expiry else None

    def close_if_empty(self, model: str) -> bool:
        """Forget an empty queue; True if it was closed."""
        queue = self._queues.get(model)
        if queue is None or queue.count:
            return False
        del self._queues[model]
        return True

    def take_all(self, model: str) -> list[Request]:
        """Empty ``model``'s queue (the caller answers what it returns)."""
        queue = self._queues.get(model)
        taken = []
        while queue is not None and queue.count:
            taken.append(queue.pop())
        return taken
