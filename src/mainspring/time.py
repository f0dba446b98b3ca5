"""The one source of time: integer nanoseconds everywhere inside."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

NS_PER_US = 1_000
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


class Clock(Protocol):
    """Anything that tells the current time in nanoseconds."""

    def now_ns(self) -> int: ...


class WallClock:
    """Monotonic real time."""

    def now_ns(self) -> int:
        return time.monotonic_ns()


class ManualClock:
    """A clock that only moves when told to (tests, the simulator)."""

    def __init__(self, start_ns: int = 0) -> None:
        self._now_ns = start_ns

    def now_ns(self) -> int:
        return self._now_ns

    def set(self, now_ns: int) -> None:
        if now_ns < self._now_ns:
            raise ValueError(f"time cannot go backwards: {now_ns} < {self._now_ns}")
        self._now_ns = now_ns

    def advance(self, delta_ns: int) -> None:
        if delta_ns < 0:
            raise ValueError(f"cannot advance by a negative delta: {delta_ns}")
        self._now_ns += delta_ns


def ms_to_ns(ms: float) -> int:
    return round(ms * NS_PER_MS)


def ns_to_ms(ns: float) -> float:
    return ns / NS_PER_MS


def s_to_ns(s: float) -> int:
    return round(s * NS_PER_S)


class Timer(Clock, Protocol):
    """A clock that can also call back at a future time (the event loop, or a thread timer)."""

    def call_at(self, time_ns: int, callback: Callable[[], None]) -> None: ...
