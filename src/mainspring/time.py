"""The one source of time: integer nanoseconds everywhere inside."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
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


class LoopTimer(WallClock):
    """The running asyncio event loop as a ``Timer``: monotonic time, which is the loop's own clock
    (``loop.time()``), and callbacks run on the loop at their time."""

    def call_at(self, time_ns: int, callback: Callable[[], None]) -> None:
        asyncio.get_running_loop().call_at(time_ns / NS_PER_S, callback)


class CpuLedger:
    """This thread's CPU time split by part of the work (``with ledger.part("policy"): ...``).

    Parts nest: an inner part's time is not its outer part's, so the parts add up to the time spent in
    any of them. A part must not span an ``await`` (the loop would charge other work to it). Reading the
    thread's CPU clock costs a system call (about a microsecond), so a server measures this only when asked
    (``cpu_ledger``); ``NO_LEDGER`` takes the same calls and does nothing."""

    def __init__(self, cpu_ns: Callable[[], int] = time.thread_time_ns) -> None:
        self.ns: dict[str, int] = {}
        self._cpu_ns = cpu_ns
        self._open: list[str] = []
        self._mark = 0
        self._parts: dict[str, _Part] = {}
        self.started_ns = cpu_ns()  # this thread's CPU clock when the ledger began

    def part(self, name: str) -> AbstractContextManager[None]:
        found = self._parts.get(name)
        if found is None:
            found = self._parts[name] = _Part(self, name)
        return found

    def enter(self, name: str) -> None:
        now = self._cpu_ns()
        if self._open:
            outer = self._open[-1]
            self.ns[outer] = self.ns.get(outer, 0) + now - self._mark
        self._open.append(name)
        self._mark = now

    def leave(self) -> None:
        now = self._cpu_ns()
        name = self._open.pop()
        self.ns[name] = self.ns.get(name, 0) + now - self._mark
        self._mark = now

    def unattributed_ns(self) -> int:
        """This thread's CPU since the ledger began outside every part (called on the ledger's thread)."""
        return self._cpu_ns() - self.started_ns - sum(self.ns.values())


class _Part:
    def __init__(self, ledger: CpuLedger, name: str) -> None:
        self._ledger = ledger
        self._name = name

    def __enter__(self) -> None:
        self._ledger.enter(self._name)

    def __exit__(self, *_: object) -> None:
        self._ledger.leave()  # an exception passes on


class _NoPart:
    def __enter__(self) -> None:
        pass

    def __exit__(self, *_: object) -> None:
        pass


class _NoLedger(CpuLedger):
    """Measures nothing, at the cost of a method call per part."""

    _none = _NoPart()

    def __init__(self) -> None:
        super().__init__(lambda: 0)

    def part(self, name: str) -> AbstractContextManager[None]:
        return self._none


NO_LEDGER: CpuLedger = _NoLedger()
