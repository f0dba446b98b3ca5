"""The open-loop driver: requests leave when the schedule says, never when earlier answers came.

Every request's latency counts from its *scheduled* send time, so a driver that falls behind
shows up as latency, not as fewer requests (no coordinated omission), and the driver measures
how late it sent each one (``send_lag``). Closed-loop workloads get their follow-up requests
from ``Workload.on_answer``, scheduled like any other.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from mainspring.protocol import ResponseStatus
from mainspring.time import NS_PER_S
from mainspring.workload import Arrival, Workload

LEAD_NS = 50_000_000  # time from start to the schedule's zero, so the first sends are not late


class Sender(Protocol):
    """Sends one inference request and says how it was answered: a status and its reason."""

    async def send(self, model: str, slo_ns: int) -> tuple[ResponseStatus, str]: ...


@dataclass(frozen=True, slots=True)
class Sent:
    """One request as the client saw it; times are ns from the schedule's zero."""

    index: int
    model: str
    label: str
    scheduled_ns: int
    sent_ns: int
    answered_ns: int
    slo_ns: int
    status: ResponseStatus
    reason: str

    @property
    def good(self) -> bool:
        return self.status is ResponseStatus.SUCCESS and self.answered_ns - self.scheduled_ns <= self.slo_ns


@dataclass
class DriveResult:
    sent: list[Sent]
    duration_ns: int  # of the schedule
    unanswered: int  # still open when the driver gave up waiting (counted as errors in ``sent``)


async def drive(
    arrivals: Iterable[Arrival],
    workload: Workload,
    sender: Sender,
    default_slo_ns: int,
    duration_ns: int,
    progress: Callable[[int, int], None] | None = None,
    give_up_after_ns: int = 30 * NS_PER_S,
) -> DriveResult:
    """Send ``arrivals`` (plus closed-loop follow-ups) on schedule; wait for every answer, at most
    ``give_up_after_ns`` past the schedule's end."""
    driver = _Driver(workload, sender, default_slo_ns, duration_ns, give_up_after_ns)
    await driver.send_all(iter(arrivals), progress)
    unanswered = await driver.collect()
    return DriveResult(driver.sent, duration_ns, unanswered)


class _Driver:
    """The state of one run: what was sent and answered, follow-ups due, requests in flight."""

    def __init__(
        self, workload: Workload, sender: Sender, default_slo_ns: int, duration_ns: int, give_up_after_ns: int
    ) -> None:
        self._workload, self._sender = workload, sender
        self._default_slo_ns, self._duration_ns = default_slo_ns, duration_ns
        self._clock = time.perf_counter_ns
        self._zero = self._clock() + LEAD_NS
        self._end_ns = duration_ns + give_up_after_ns  # from the zero: when the driver stops waiting
        self.sent: list[Sent] = []
        self._follow_ups: list[tuple[int, int, Arrival]] = []
        self._woken = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._counter = itertools.count()  # ties in the follow-up heap

    def _now(self) -> int:
        return self._clock() - self._zero

    async def _one(self, index: int, arrival: Arrival) -> None:
        slo = arrival.slo_ns or self._default_slo_ns
        sent_at = self._now()
        try:
            status, reason = await self._sender.send(arrival.model, slo)
        except asyncio.CancelledError:  # the driver gave up waiting: recorded, so nothing goes missing
            self.sent.append(Sent(index, arrival.model, arrival.label, arrival.time_ns, sent_at, self._now(), slo,
                                  ResponseStatus.ERROR, "no answer before the driver gave up"))  # fmt: skip
            raise
        except Exception as error:  # a dropped connection is an answer too: an error
            status, reason = ResponseStatus.ERROR, f"{type(error).__name__}: {error}"
        answered = self._now()
        record = Sent(index, arrival.model, arrival.label, arrival.time_ns, sent_at, answered, slo, status, reason)
        self.sent.append(record)
        follow = self._workload.on_answer(arrival, answered, record.good)
        if follow is not None and follow.time_ns < self._duration_ns:
            heapq.heappush(self._follow_ups, (follow.time_ns, next(self._counter), follow))
            self._woken.set()

    async def send_all(self, generated: Iterator[Arrival], progress: Callable[[int, int], None] | None) -> None:
        """Send every arrival and follow-up at its time, until the schedule ends and nothing is in flight."""
        follow_ups, tasks = self._follow_ups, self._tasks
        upcoming = next(generated, None)
        index = 0
        while True:
            if follow_ups and (upcoming is None or follow_ups[0][0] < upcoming.time_ns):
                arrival, from_heap = follow_ups[0][2], True
            elif upcoming is not None and upcoming.time_ns < self._duration_ns:
                arrival, from_heap = upcoming, False
            elif not tasks and not follow_ups:
                return
            else:  # only answers (and the follow-ups they cause) are left, for a while
                left_ns = self._end_ns - self._now()
                if left_ns <= 0:
                    return
                self._woken.clear()
                await _wait(self._woken, tasks, left_ns / NS_PER_S)
                continue
            delay_ns = arrival.time_ns - self._now()
            if delay_ns > 0:
                self._woken.clear()
                await _wait(self._woken, set(), delay_ns / NS_PER_S)
                continue  # a follow-up may have come due first
            if from_heap:
                heapq.heappop(follow_ups)
            else:
                upcoming = next(generated, None)
            task = asyncio.create_task(self._one(index, arrival))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            index += 1
            if progress is not None and index % 256 == 0:
                progress(self._now(), len(self.sent))
            if self._now() > self._end_ns:
                return

    async def collect(self) -> int:
        """Wait for the answers still in flight until the driver gives up; how many never came."""
        if not self._tasks:
            return 0
        left_s = max(0.0, (self._end_ns - self._now()) / NS_PER_S)
        _, pending = await asyncio.wait(set(self._tasks), timeout=left_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)


async def _wait(woken: asyncio.Event, tasks: set[asyncio.Task[None]], timeout_s: float | None) -> None:
    """Until ``woken`` is set, a task finishes, or the timeout passes."""
    wake: asyncio.Future[Any] = asyncio.ensure_future(woken.wait())
    waiters: set[asyncio.Future[Any]] = {wake, *tasks}
    await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if not wake.done():
        wake.cancel()
