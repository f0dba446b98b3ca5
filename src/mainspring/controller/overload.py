"""The live controller's load limits: what it holds (requests and their input bytes) and how far
behind its own event loop runs. Past any bound a new call is refused at once (429 ``overloaded``),
which is cheap, instead of queued, which would make every pass slower until nothing meets its deadline
(``benchmarks/controller_scale.py``)."""

from __future__ import annotations

import asyncio
import time

from mainspring.time import NS_PER_S

LAG_TICK_S = 0.005


class ServerLoadLimits:
    def __init__(self, max_outstanding: int, max_outstanding_bytes: int, max_loop_lag_ns: int) -> None:
        self.max_outstanding = max_outstanding
        self.max_outstanding_bytes = max_outstanding_bytes
        self.max_loop_lag_ns = max_loop_lag_ns
        self.loop_lag_ns = 0  # how late a 5 ms timer wakes, held two ticks in a row, decaying by half every 100 ms
        self._bytes_of: dict[int, int] = {}  # request id -> its input bytes
        self._open_bytes = 0
        self._monitor: asyncio.Task[None] | None = None

    @property
    def outstanding(self) -> int:
        return len(self._bytes_of)

    def refusal(self, count: int, size: int) -> str | None:
        """Why ``count`` more requests of ``size`` input bytes each are refused now, or None."""
        if self.outstanding + count > self.max_outstanding:
            return f"{self.outstanding} requests outstanding (max_outstanding)"
        if self._open_bytes + size * count > self.max_outstanding_bytes:
            return f"{self._open_bytes} bytes of inputs outstanding (max_outstanding_bytes)"
        if self.loop_lag_ns > self.max_loop_lag_ns:
            return f"the controller is {self.loop_lag_ns / 1e6:.0f} ms behind (max_loop_lag_ms)"
        return None

    def admit(self, request_id: int, size: int) -> None:
        self._bytes_of[request_id] = size
        self._open_bytes += size

    def release(self, request_id: int) -> None:
        self._open_bytes -= self._bytes_of.pop(request_id, 0)

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start measuring the loop's lag (once)."""
        if self._monitor is None:
            self._monitor = loop.create_task(self._watch_loop_lag())

    def stop(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()

    async def _watch_loop_lag(self, period_s: float = LAG_TICK_S) -> None:
        """How far behind the event loop runs: how late a short timer wakes. The lesser of two wakes in a
        row: one long callback (a large body decoded, a collection) delays one wake, an overloaded loop
        every one. The figure then decays by half every 100 ms."""
        period_ns = round(period_s * NS_PER_S)
        previous = 0
        while True:
            begin = time.monotonic_ns()
            await asyncio.sleep(period_s)
            elapsed = time.monotonic_ns() - begin
            late, previous = min(elapsed - period_ns, previous), elapsed - period_ns
            self.loop_lag_ns = round(max(late, self.loop_lag_ns * 0.5 ** (elapsed / 100e6)))
