"""A real-time ``Timer`` (``mainspring.time``) on a thread of its own, for emulated devices run live."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable

from mainspring.time import WallClock


class ThreadTimer:
    """A real-time ``Timer``: callbacks run in order on one thread at (or just after) their time."""

    def __init__(self, name: str = "timer") -> None:
        self._clock = WallClock()
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._wakeup = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def now_ns(self) -> int:
        return self._clock.now_ns()

    def call_at(self, time_ns: int, callback: Callable[[], None]) -> None:
        with self._wakeup:
            heapq.heappush(self._queue, (time_ns, next(self._seq), callback))
            self._wakeup.notify()

    def close(self) -> None:
        with self._wakeup:
            self._closed = True
            self._wakeup.notify()
        self._thread.join(5.0)

    def _loop(self) -> None:
        while True:
            with self._wakeup:
                while not self._closed and (not self._queue or self._queue[0][0] > self.now_ns()):
                    timeout = (self._queue[0][0] - self.now_ns()) / 1e9 if self._queue else None
                    self._wakeup.wait(timeout)
                if self._closed:
                    return
                _, _, callback = heapq.heappop(self._queue)
            callback()
