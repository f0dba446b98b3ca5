"""The frontend processes in front of simulated cells: each one core on the simulated clock, shedding at
arrival with the gate the live frontend runs.

Live (``serve --cells``), frontend processes read each HTTP call, parse it and route it to a cell; each is
one event loop on one core. Here a call waits for its frontend's core in order of arrival, takes
``FrontendCost.request_ns`` of it (in and out: parsing, routing, the answer's encoding), then reaches the
cells' routing; its answer, on the way back, waits behind what the core holds by then. The gate is
``frontend/shedding.py``'s ``ArrivalGate``: its 5 ms timer waits for the core like any other work, so it
sees the lag the live timer sees, and the least of the last ``PERSIST`` wakes is what it counts, as live.
It decides on a call when the core reaches it, as the live frontend does once the call's headers are read:
a call it sheds costs ``refusal_ns`` and is answered ``overloaded`` then. A frontend that costs nothing is no core at
all (``Passthrough``): a call reaches the routing, and an answer its client, at once, as before it was
modelled.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from mainspring.cells.cost import FrontendCost
from mainspring.frontend.shedding import TICK_S, ArrivalGate, target_lag_ns
from mainspring.protocol import Outcome, Request, Response
from mainspring.sim.engine import PRIORITY_RESULT, PRIORITY_WAKEUP, EventLoop
from mainspring.sim.machine import Machine
from mainspring.telemetry.recorder import Recorder
from mainspring.time import NS_PER_MS, NS_PER_S

TICK_NS = round(TICK_S * NS_PER_S)
Event = Callable[[], None]


@dataclass(frozen=True)
class FrontendRow:
    frontend: int
    calls: int
    shed: int  # refused at arrival by its gate
    busy: float  # share of the run its core was working
    most_lag_ms: float  # the latest its gate's timer woke


class FrontendCore:
    """One frontend process's core: work done one piece at a time in order of arrival, and its arrival gate,
    which decides on a call when the core reaches it (as live: the call is refused once its headers are read)."""

    def __init__(self, index: int, loop: EventLoop, cost: FrontendCost, gate: ArrivalGate,
                 running: Callable[[], bool], machine: Machine | None = None) -> None:  # fmt: skip
        self.index = index
        self._machine = machine or Machine()  # the cores it shares with the other processes
        self.gate = gate
        self.calls = 0
        self.shed = 0
        self.busy_ns = 0
        self.most_lag_ns = 0
        self._loop = loop
        self._cost = cost
        self._running = running
        self._waiting: collections.deque[Event] = collections.deque()  # each piece starts, and says its cost
        self._working: Event | None = None  # what the core is doing: it ends with this
        loop.call_at(TICK_NS, self._timer_due, PRIORITY_WAKEUP)

    @property
    def holding(self) -> int:
        """Calls and answers waiting for this core, or on it."""
        return len(self._waiting) + (self._working is not None)

    def arrive(self, forward: Event, refuse: Callable[[str], None]) -> None:
        """A call reaches this frontend: taken (``forward`` once the core has read it) or shed (``refuse``)."""
        self.calls += 1
        self._queue(partial(self._read, forward, refuse))

    def answer(self, then: Event) -> None:
        """A cell's answer goes out once the core reaches it (its cost was charged with the call's)."""
        self._queue(partial(self._work, 0, then))

    def flush(self) -> None:
        """The run is over: what the core holds happens now, in order (the calls it holds are taken)."""
        while True:
            working, self._working = self._working, None
            if working is not None:
                working()
            elif self._waiting:
                self._waiting.popleft()()
            else:
                return

    def row(self, span_ns: int) -> FrontendRow:
        return FrontendRow(self.index, self.calls, self.shed, self.busy_ns / max(span_ns, 1),
                           self.most_lag_ns / NS_PER_MS)  # fmt: skip

    def _queue(self, piece: Event) -> None:
        self._waiting.append(piece)
        if self._working is None:
            self._next()

    def _next(self) -> None:
        while self._working is None and self._waiting:
            self._waiting.popleft()()

    def _read(self, forward: Event, refuse: Callable[[str], None]) -> None:
        if self.gate.admit():
            self._work(self._cost.request_ns, forward)
        else:
            self.shed += 1
            self._work(self._cost.refusal_ns, partial(refuse, self.gate.reason()))

    def _work(self, ns: int, then: Event) -> None:
        """The core works ``ns`` (and its background's share), then ``then``."""
        work = self._cost.loaded(ns)
        if not work:
            then()
            return
        work = self._machine.start(work)
        self.busy_ns += work
        self._working = then
        self._loop.call_at(self._loop.now_ns() + work, partial(self._done, then), PRIORITY_RESULT)

    def _done(self, then: Event) -> None:
        self._machine.end()
        if self._working is then:  # else flushed
            self._working = None
            then()
            self._next()

    def _timer_due(self) -> None:
        """The live timer is ready now; it wakes once the core has done what it already holds."""
        self._queue(partial(self._timer_woke, self._loop.now_ns()))

    def _timer_woke(self, due_ns: int) -> None:
        now = self._loop.now_ns()
        self.most_lag_ns = max(self.most_lag_ns, now - due_ns)
        self.gate.woke(now - due_ns)
        if self._running():  # the live timer sleeps a tick from its wake
            self._loop.call_at(now + TICK_NS, self._timer_due, PRIORITY_WAKEUP)


class Frontends:
    """``count`` frontend cores; a call goes to one in turn (by its id) and its answer back through it.
    Calls they shed are recorded here; calls they take reach the cells through ``route``."""

    def __init__(self, count: int, loop: EventLoop, cost: FrontendCost, slo_ns: int, running: Callable[[], bool],
                 route: Callable[[Request], None], answered: Callable[[Request, Response], None],
                 machine: Machine | None = None) -> None:  # fmt: skip
        if count < 1:
            raise ValueError(f"frontends must be at least 1, got {count}")
        self.cores = [FrontendCore(i, loop, cost, ArrivalGate(target_lag_ns(slo_ns)), running, machine)
                      for i in range(count)]  # fmt: skip
        self.recorder = Recorder()  # the calls shed at arrival
        self._loop = loop
        self._route = route
        self._answered = answered

    @property
    def holding(self) -> int:
        return sum(core.holding for core in self.cores)

    def arrive(self, request: Request) -> None:
        core = self._core(request)
        core.arrive(partial(self._route, request), partial(self._shed, request))

    def answer(self, request: Request, then: Event) -> None:
        self._core(request).answer(then)

    def overloaded_elsewhere(self, request: Request) -> None:
        """A cell refused ``request`` as overloaded: its frontend sheds as for a late tick, as live."""
        self._core(request).gate.overloaded_elsewhere()

    def flush(self) -> None:
        for core in self.cores:
            core.flush()

    def rows(self, span_ns: int) -> list[FrontendRow]:
        return [core.row(span_ns) for core in self.cores]

    def _core(self, request: Request) -> FrontendCore:
        return self.cores[request.id % len(self.cores)]

    def _shed(self, request: Request, reason: str) -> None:
        self.recorder.on_request(request, request.arrival_ns)
        response = Response(request.id, Outcome.OVERLOADED, reason)
        self.recorder.on_answer(request, response, self._loop.now_ns())
        self._answered(request, response)


class Passthrough:
    """Frontends that cost nothing: no core, no gate; what ``Frontends`` does, at once."""

    def __init__(self, route: Callable[[Request], None]) -> None:
        self.recorder = Recorder()  # sheds nothing
        self.holding = 0
        self.arrive = route

    def answer(self, request: Request, then: Event) -> None:
        then()

    def overloaded_elsewhere(self, request: Request) -> None:
        pass

    def flush(self) -> None:
        pass

    def rows(self, span_ns: int) -> list[FrontendRow]:
        return []


def make_frontends(count: int, loop: EventLoop, cost: FrontendCost, slo_ns: int, running: Callable[[], bool],
                   route: Callable[[Request], None], answered: Callable[[Request, Response], None],
                   machine: Machine | None = None) -> Frontends | Passthrough:  # fmt: skip
    """``count`` frontend cores in front of ``route``, or none where they cost nothing (or ``count`` is 0)."""
    if not count or cost.free:
        return Passthrough(route)
    return Frontends(count, loop, cost, slo_ns, running, route, answered, machine)
