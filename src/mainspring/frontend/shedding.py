"""Shedding at arrival: when a process's own CPU runs out, refuse new calls before reading them.

A process that serves HTTP and gRPC and also plans (the controller) has one event loop. Past the
rate its CPU can take, every ready callback waits longer: a worker's result, a planning pass and a
new call alike. Admitting everything then makes every admitted call late (goodput collapses);
refusing only once the loop is far behind (``max_loop_lag_ms``) is too late, and a refusal after the
body was read and parsed costs almost as much as serving.

``ArrivalGate`` watches how late a short timer wakes on the loop (its lag: how long any ready work
waits) and keeps a share of new calls it admits: the share is cut each tick the lag is above a target,
in proportion to how far above (a loop 20 times late keeps a twentieth: its timer wakes that much less
often, so a fixed cut would come ever more slowly while the backlog grows), and grows back by a step
each tick it is below, so the admitted rate settles where the loop keeps up, whatever the rate, the
number of workers or the models' mix. The rest are refused
at once (429 ``overloaded``), before their body is read. A controller's ``overloaded`` refusal,
seen by a frontend process, counts as a late tick there too: that frontend then sheds for the
controller. Admission is spread evenly (a credit per call), not drawn at random, so no seed is needed
and a test sees the same calls admitted every run.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

from mainspring.time import NS_PER_MS, NS_PER_S

TICK_S = 0.005
CUT = 0.7  # the share kept after a tick above the target: halves in two late ticks (10 ms)
STEP = 0.05  # the share regained per tick below it: from the floor to all in about 100 ms
FLOOR = 0.02  # never refuse everything: a few calls keep measuring whether the loop caught up
PERSIST = 2  # wakes in a row a lag must last to count (10 ms)
SHED = "shed"  # the cause a refusal is counted under (``mainspring_rejections_total{outcome="overloaded"}``)


def target_lag_ns(slo_ns: int) -> int:
    """The loop lag a gate keeps below: a twentieth of the SLO, at least 1 ms. A call passes the loop some
    five times (read, submitted, its action sent, the result, the answer): late by that much at each, it
    still has three quarters of its SLO to be served in."""
    return max(NS_PER_MS, slo_ns // 20)


class ArrivalGate:
    def __init__(self, target_ns: int, watching: bool = True) -> None:
        """``watching`` False: never ticks and admits every call (shedding at arrival turned off)."""
        if target_ns <= 0:
            raise ValueError(f"target lag must be positive, got {target_ns} ns")
        self.target_ns = target_ns
        self.watching = watching
        self.share = 1.0
        self.lag_ns = 0  # of the last tick
        self._credit = 0.0
        self._recent = collections.deque([0] * PERSIST, maxlen=PERSIST)
        self._told = False  # the controller refused a call as overloaded since the last wake
        self._task: asyncio.Task[None] | None = None

    def woke(self, late_ns: int) -> None:
        """The timer woke ``late_ns`` after it was due. The share is cut when each of the last ``PERSIST`` wakes
        was late (a loop that is behind is late at every wake, while one long callback, a large body parsed,
        or the machine pausing the process delays one), and grows back only when each was on time: a loop
        that has just caught up on a backlog is not yet shown to keep up."""
        recent = self._recent
        recent.append(max(0, late_ns))
        least = min(recent)
        if self._told:  # the controller is behind: as if this loop were
            self._told = False
            self.tick(max(least, self.target_ns + 1))
            return
        if least > self.target_ns or max(recent) <= self.target_ns:
            self.tick(least)
        else:  # late at one of them only: neither cut nor grow back until the loop shows which it is
            self.lag_ns = least

    def tick(self, lag_ns: int) -> None:
        """A tick at ``lag_ns``: cut the share above the target (at least to ``CUT``, further in proportion to
        the lag), grow it back below."""
        self.lag_ns = lag_ns
        if lag_ns > self.target_ns:
            self.share = max(FLOOR, self.share * min(CUT, self.target_ns / lag_ns))
        else:
            self.share = min(1.0, self.share + STEP)

    def overloaded_elsewhere(self) -> None:
        """The controller refused a call as overloaded: the next wake counts as late here too (once, however
        many it refused meanwhile: a cut per refusal would take the share to the floor in one burst)."""
        if self.watching:
            self._told = True

    def admit(self) -> bool:
        """Whether the call arriving now is taken; the share over time is what is admitted."""
        if self.share >= 1.0:
            return True
        self._credit += self.share
        if self._credit >= 1.0:
            self._credit -= 1.0
            return True
        return False

    def reason(self) -> str:
        return (f"overloaded: the server's event loop runs {self.lag_ns / NS_PER_MS:.1f} ms late; it takes "
                f"{self.share:.0%} of new calls until it catches up")  # fmt: skip

    def watch(self) -> None:
        """Tick every 5 ms on the running loop (once)."""
        if self._task is None and self.watching:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self) -> None:
        period_ns = round(TICK_S * NS_PER_S)
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                begin = time.monotonic_ns()
                await asyncio.sleep(TICK_S)
                self.woke(time.monotonic_ns() - begin - period_ns)
