"""INFER5's network send gate (``NetworkExecutor`` in ``infer5_scheduler.cpp`` at fbd2f11).

The source's controller has one executor for all its workers: at most ``network_concurrency`` (2)
actions on the wire at once; the rest wait in order. A waiting action taken off after its ``send_by`` is
not sent: it fails, and its error is reported at its ``error_at`` (an infer's latest start plus its
duration). An infer must be sent by ``max(created + 1 ms, latest - 5 ms)``; loads and evictions never fail.

The source frees a slot when its socket reports the message written. The policy hears nothing of that,
so here an action holds its slot for the one-way trip to its worker (the deadline margin: the
simulator's network latency). With a trip of 0 the gate never holds anything.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from mainspring.protocol import Action
from mainspring.scheduler.lanes import NEVER
from mainspring.time import NS_PER_MS

NETWORK_CONCURRENCY = 2  # actions on the wire at once, to all workers together
SEND_SLACK_NS = 5 * NS_PER_MS  # an infer must be sent this long before its latest start


@dataclass(slots=True)
class _Waiting:
    action: Action
    send_by_ns: int
    error_at_ns: int


class SendGate:
    """Actions in, the ones that go now out; late ones come back as failures at their error time."""

    def __init__(self, trip_ns: int, concurrency: int = NETWORK_CONCURRENCY) -> None:
        self.trip_ns = trip_ns
        self.concurrency = concurrency
        self._on_wire: deque[int] = deque()  # when each action on the wire has arrived, in send order
        self._waiting: deque[_Waiting] = deque()
        self._failures: list[tuple[int, int, Action]] = []  # error time, action id, action

    def send(self, action: Action, send_by_ns: int, error_at_ns: int, now_ns: int, out: list[Action]) -> None:
        """Queue ``action``; whatever may go now is appended to ``out``."""
        self._waiting.append(_Waiting(action, send_by_ns, error_at_ns))
        self.release(now_ns, out)

    def release(self, now_ns: int, out: list[Action]) -> None:
        """Free the slots whose actions have arrived and send what waits, in order (``sendComplete``)."""
        wire = self._on_wire
        if self.trip_ns <= 0:
            wire.clear()
        while self._waiting:
            while wire and wire[0] <= now_ns:
                wire.popleft()
            if len(wire) >= self.concurrency:
                return
            waiting = self._waiting.popleft()
            if waiting.send_by_ns < now_ns:  # too late to send: its error is reported later
                heapq.heappush(self._failures, (waiting.error_at_ns, waiting.action.action_id, waiting.action))
                continue
            out.append(waiting.action)
            if self.trip_ns > 0:
                wire.append(now_ns + self.trip_ns)

    def failures_due(self, now_ns: int) -> list[Action]:
        """Actions not sent in time whose error is due by ``now_ns``, in error-time order."""
        due = []
        while self._failures and self._failures[0][0] <= now_ns:
            due.append(heapq.heappop(self._failures)[2])
        return due

    def next_event_ns(self) -> int:
        """When the gate next has something to do (a slot freeing for a waiting action, an error due)."""
        best = self._failures[0][0] if self._failures else NEVER
        if self._waiting and self._on_wire:
            best = min(best, self._on_wire[0])
        return best

    def forget_device(self, device: int) -> None:
        """A device left: what waits for it is dropped (the policy requeues its requests)."""
        self._waiting = deque(w for w in self._waiting if w.action.device != device)
        self._failures = [f for f in self._failures if f[2].device != device]
        heapq.heapify(self._failures)
