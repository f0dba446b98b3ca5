"""One controller core on the simulated clock: the controller's CPU time charged to simulated time.

Events for the controller (a request, a result, a wake-up) wait in an inbox while the core is busy.
A turn takes every waiting event in, for as long as the cost model says the policy took
(``cells/cost.py``), then runs one scheduling pass at that moment, for as long as it takes; what the
turn decided (actions to devices, answers to clients) leaves when the pass ends. So an overloaded controller
plans late and answers late, as a live one does, and a worker refuses the actions whose window
passed while the controller was still deciding. With every cost zero a turn takes no time and a
run is the same as without a core.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from mainspring.cells.cost import CostedScheduler
from mainspring.sim.engine import PRIORITY_RESULT, EventLoop
from mainspring.sim.machine import Machine

Event = Callable[[], None]


class ControllerCore:
    def __init__(self, loop: EventLoop, costed: CostedScheduler, machine: Machine | None = None) -> None:
        self._loop = loop
        self._costed = costed
        self._machine = machine or Machine()  # the cores it shares with the other processes (``sim/machine.py``)
        self._inbox: list[tuple[int, Event]] = []  # (posted at, event)
        self._passes: list[Event] = []
        self._outbox: list[Event] = []
        self._busy = False
        self._turn_due = False
        self.busy_ns = 0  # simulated time this core spent deciding
        self.most_waited_ns = 0  # the longest one event waited

    def post(self, event: Event) -> None:
        """``event`` runs on the controller in the next turn (at this instant, if the core is free)."""
        self._inbox.append((self._loop.now_ns(), event))
        self._start_soon()

    def defer(self, callback: Event) -> None:
        """The controller's ``defer``: its pass runs at the end of this turn, after the turn's events."""
        self._passes.append(callback)

    def send(self, output: Event) -> None:
        """What the turn decided; it leaves when the turn ends."""
        if self._busy:
            self._outbox.append(output)
        else:
            output()

    def lag_ns(self, now_ns: int) -> int:
        """How long the oldest waiting event has waited (what a live controller's late timer shows)."""
        return now_ns - self._inbox[0][0] if self._inbox else 0

    def flush(self) -> None:
        """Hand out what the current turn decided now (the run is over)."""
        self._release()

    def _start_soon(self) -> None:
        if not self._busy and not self._turn_due:
            self._turn_due = True
            self._loop.defer(self._turn)

    def _turn(self) -> None:
        self._turn_due = False
        self._busy = True
        events, self._inbox = self._inbox, []
        now = self._loop.now_ns()
        for posted_ns, event in events:
            waited = now - posted_ns
            self.most_waited_ns = max(self.most_waited_ns, waited)
            event()
        self._after(self._costed.take(), self._pass)

    def _pass(self) -> None:
        """The scheduling pass reads the clock once the turn's events are taken in, as live."""
        while self._passes:
            self._passes.pop(0)()
        self._after(self._costed.take(), self._release)

    def _after(self, busy_ns: int, then: Event) -> None:
        if busy_ns == 0:
            then()
            return
        busy_ns = self._machine.start(busy_ns)
        self.busy_ns += busy_ns
        self._loop.call_at(self._loop.now_ns() + busy_ns, partial(self._done, then), PRIORITY_RESULT)

    def _done(self, then: Event) -> None:
        self._machine.end()
        then()

    def _release(self) -> None:
        outputs, self._outbox = self._outbox, []
        self._busy = False
        for output in outputs:
            output()
        if self._inbox:
            self._start_soon()
