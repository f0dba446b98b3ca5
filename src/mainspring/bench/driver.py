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
    clock = time.perf_counter_ns
    zero = clock() + LEAD_NS
    sent: list[Sent] = []
    follow_ups: list[tuple[int, int, Arrival]] = []
    woken = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()
    counter = itertools.count()  # ties in the follow-up heap

    async def one(index: int, arrival: Arrival) -> None:
        slo = arrival.slo_ns or default_slo_ns
        sent_at = clock() - zero
        try:
            status, reason = await sender.send(arrival.model, slo)
        except asyncio.CancelledError:  # the driver gave up waiting: recorded, so nothing goes missing
            sent.append(Sent(index, arrival.model, arrival.label, arrival.time_ns, sent_at, clock() - zero, slo,
                             ResponseStatus.ERROR, "no answer before the driver gave up"))  # fmt: skip
            raise
        except Exception as error:  # a dropped connection is an answer too: an error
            status, reason = ResponseStatus.ERROR, f"{type(error).__name__}: {error}"
        answered = clock() - zero
        record = Sent(index, arrival.model, arrival.label, arrival.time_ns, sent_at, answered, slo, status, reason)
        sent.append(record)
        follow = workload.on_answer(arrival, answered, record.good)
        if follow is not None and follow.time_ns < duration_ns:
            heapq.heappush(follow_ups, (follow.time_ns, next(counter), follow))
            woken.set()

    generated: Iterator[Arrival] = iter(arrivals)
    upcoming = next(generated, None)
    index = 0
    while True:
        if follow_ups and (upcoming is None or follow_ups[0][0] < upcoming.time_ns):
            arrival = follow_ups[0][2]
            from_heap = True
        elif upcoming is not None and upcoming.time_ns < duration_ns:
            arrival, from_heap = upcoming, False
        elif not tasks and not follow_ups:
            break
        else:  # only answers (and the follow-ups they cause) are left, for a while
            left_ns = zero + duration_ns + give_up_after_ns - clock()
            if left_ns <= 0:
                break
            woken.clear()
            await _wait(woken, tasks, left_ns / NS_PER_S)
            continue
        delay_ns = arrival.time_ns - (clock() - zero)
        if delay_ns > 0:
            woken.clear()
            await _wait(woken, set(), delay_ns / NS_PER_S)
            continue  # a follow-up may have come due first
        if from_heap:
            heapq.heappop(follow_ups)
        else:
            upcoming = next(generated, None)
        task = asyncio.create_task(one(index, arrival))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        index += 1
        if progress is not None and index % 256 == 0:
            progress(clock() - zero, len(sent))
        if clock() - zero > duration_ns + give_up_after_ns:
            break
    unanswered = 0
    if tasks:
        left_s = max(0.0, (zero + duration_ns + give_up_after_ns - clock()) / NS_PER_S)
        _, pending = await asyncio.wait(set(tasks), timeout=left_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        unanswered = len(pending)
    return DriveResult(sent, duration_ns, unanswered)


async def _wait(woken: asyncio.Event, tasks: set[asyncio.Task[None]], timeout_s: float | None) -> None:
    """Until ``woken`` is set, a task finishes, or the timeout passes."""
    wake: asyncio.Future[Any] = asyncio.ensure_future(woken.wait())
    waiters: set[asyncio.Future[Any]] = {wake, *tasks}
    await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if not wake.done():
        wake.cancel()
