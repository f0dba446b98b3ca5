"""Discrete-event engine: a virtual clock and an event heap keyed (time, priority, seq).

No threads, no sleeping: time jumps from one event to the next, ties break by
priority then by insertion order, so a seeded run is exactly reproducible.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from functools import partial

from mainspring.protocol import Action
from mainspring.time import ManualClock

# Lower runs first among events at the same instant: results reach the controller
# before new arrivals, and policy wake-ups see both.
PRIORITY_RESULT = 0
PRIORITY_DEVICE = 1
PRIORITY_ARRIVAL = 2
PRIORITY_WAKEUP = 3
# The controller's deferred scheduling pass runs after every other event of its instant, so that
# events at one instant share one pass, as a live controller's events share a turn of its loop.
PRIORITY_PASS = 4


class EventLoop:
    """Virtual time. Implements ``Timer`` so emulated devices can run on it."""

    def __init__(self, start_ns: int = 0) -> None:
        self.clock = ManualClock(start_ns)
        self._heap: list[tuple[int, int, int, Callable[[], None]]] = []
        self._seq = 0
        self.events_processed = 0

    def now_ns(self) -> int:
        return self.clock.now_ns()

    def call_at(self, time_ns: int, callback: Callable[[], None], priority: int = PRIORITY_DEVICE) -> None:
        if time_ns < self.clock.now_ns():
            raise ValueError(f"cannot schedule in the past: {time_ns} < {self.clock.now_ns()}")
        self._seq += 1
        heapq.heappush(self._heap, (time_ns, priority, self._seq, callback))

    def defer(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at this instant, after every other event due at it (``Controller``'s ``defer``)."""
        self.call_at(self.clock.now_ns(), callback, PRIORITY_PASS)

    def pending(self) -> int:
        return len(self._heap)

    def next_time_ns(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def run(self, until_ns: int | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Process events in order up to ``until_ns`` (inclusive), or until ``stop()`` is true."""
        heap = self._heap
        clock = self.clock
        while heap:
            if until_ns is not None and heap[0][0] > until_ns:
                break
            time_ns, _, _, callback = heapq.heappop(heap)
            clock.set(time_ns)
            callback()
            self.events_processed += 1
            if stop is not None and stop():
                return
        if until_ns is not None and until_ns > clock.now_ns():
            clock.set(until_ns)


class DelayedLink:
    """Hands each action to ``submit`` ``latency_ns`` later on the loop (a network between controller and
    device; at once without one)."""

    def __init__(self, submit: Callable[[Action], None], loop: EventLoop, latency_ns: int) -> None:
        self._submit = submit
        self._loop = loop
        self._latency_ns = latency_ns

    def submit(self, action: Action) -> None:
        if self._latency_ns:
            self._loop.call_at(self._loop.now_ns() + self._latency_ns, partial(self._submit, action))
        else:
            self._submit(action)


def seed_for(seed: int, purpose: str) -> int:
    """A run's seed for one of its random streams (the workload, a device's noise, a policy): each its own."""
    return random.Random(f"{seed}:{purpose}").getrandbits(63)
