"""Per-model request queues, earliest deadline first, with lazy removal."""

from __future__ import annotations

import heapq

from mainspring.protocol import Request


class ModelQueue:
    """Requests for one model ordered by deadline. Entries whose request left the
    shared ``live`` map (rejected on expiry) are skipped when reached."""

    __slots__ = ("_heap", "_live", "count", "max_deadline_ns", "model")

    def __init__(self, model: str, live: dict[int, Request]) -> None:
        self.model = model
        self._heap: list[tuple[int, int]] = []
        self._live = live
        self.count = 0
        self.max_deadline_ns = 0

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.deadline_ns, request.id))
        self._live[request.id] = request
        self.count += 1
        self.max_deadline_ns = max(self.max_deadline_ns, request.deadline_ns)

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
        return request

    def forget(self, request_id: int) -> None:
        """The request left the queue by another way (its entry is skipped later)."""
        del self._live[request_id]
        self.count -= 1
