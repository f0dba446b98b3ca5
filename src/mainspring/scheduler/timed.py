"""A policy wrapper that adds up the CPU time the policy itself spends (its thread's time, so
neither the emulation around it nor other threads count): what a controller core must pay."""

from __future__ import annotations

import time

from mainspring.protocol import ActionResult, Request
from mainspring.scheduler.base import Decisions, Scheduler


class TimedScheduler:
    """Forwards the three calls of the scheduler contract to ``inner`` and adds up their CPU time."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.cpu_ns = 0

    def on_request(self, request: Request, now_ns: int) -> None:
        started = time.thread_time_ns()
        self.inner.on_request(request, now_ns)
        self.cpu_ns += time.thread_time_ns() - started

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        started = time.thread_time_ns()
        self.inner.on_result(result, now_ns)
        self.cpu_ns += time.thread_time_ns() - started

    def schedule(self, now_ns: int) -> Decisions:
        started = time.thread_time_ns()
        decisions = self.inner.schedule(now_ns)
        self.cpu_ns += time.thread_time_ns() - started
        return decisions
