"""The cells behind a ``CellsPort`` and their membership, carried out: the cells of the start joined, those
added later (by the server, or listed in its file for a frontend process) joined when they answer, each
cell's signal heard, a cell that dies failed over, rejoined when it returns and brought in line
(``cells_settle.py``), one that departs forgotten. The membership (``cells/membership.py``) decides; this
does what it says (``Effect``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from mainspring.cells.membership import Do, Effect, Membership, Phase
from mainspring.cells.routing import CellSignal, Router
from mainspring.cells.wire import SignalSubscriber
from mainspring.frontend.cells_settle import CellCall, Settler
from mainspring.frontend.port import ServiceError
from mainspring.frontend.remote import RemoteController
from mainspring.time import Clock, s_to_ns

log = logging.getLogger("mainspring.frontend.cells_port")  # its lines read as the port's, as before

LISTED_JOIN_S = 10.0  # a frontend process waits this long at most for the cells listed at its start


class CellRoster:
    """The cells (``RemoteController`` each) and their ``Membership``. ``router``: told each signal;
    ``changing``: the port's lock per model (a settling cell's catch-up takes it too); ``settles``: this
    port brings returning cells in line (the server's), else it waits for them to say so."""

    def __init__(
        self,
        name: str,
        endpoints: Sequence[str],
        signal_endpoints: Sequence[str],
        router: Router,
        changing: dict[str, asyncio.Lock],
        clock: Clock,
        secret: str = "",
        cells_file: str = "",
        settles: bool = False,
    ) -> None:
        self._name = name
        self._router = router
        self._clock = clock
        self._settles = settles
        self._secret = secret  # the worker secret guards the cells' channels where they are TCP ports (Ray)
        self._tasks: set[asyncio.Task[object]] = set()
        self.membership = Membership(clock, settles)
        self.cells: list[RemoteController] = []
        for endpoint in endpoints:
            self.carry(self._new_cell(endpoint, late=False))
        self._cells_file = Path(cells_file) if cells_file else None  # cells added later, listed by the server
        self._join_timeout_s = 60.0
        self._subscriber = SignalSubscriber(list(signal_endpoints), self.on_signal, secret)
        self.settler = Settler(self.cells, self.membership, changing, self.on_cell)

    async def start(self, timeout_s: float) -> None:
        """The cells of the start, joined (those of the server's port: in line, nothing to catch up on)."""
        self._join_timeout_s = timeout_s
        self._subscriber.start()
        await asyncio.gather(*(cell.start(timeout_s) for cell in self.cells))
        for index in range(len(self.cells)):
            self.carry(self.membership.joined(index))
        if self._settles:
            await asyncio.gather(*(cell.mark_in_line() for cell in self.cells))

    async def keep_up(self, timeout_s: float) -> None:
        """From now on: the membership's timer; and the cells the server lists, those of now joined first."""
        self.spawn(self._watch())
        if self._cells_file is not None:
            await self._join_listed(min(timeout_s, LISTED_JOIN_S))
            self.spawn(self._follow_cells_file())

    async def _join_listed(self, timeout_s: float) -> None:
        """The cells the server lists now, joined before this frontend takes requests (one that does not
        answer within ``timeout_s``, a cell still starting, is joined when it does)."""
        self._sync_cells_file()
        deadline = self._clock.now_ns() + s_to_ns(timeout_s)
        while self._clock.now_ns() < deadline and any(
            not cell.joined for index, cell in enumerate(self.cells) if not self.membership.down(index)
        ):
            await asyncio.sleep(0.02)

    def add_cell(self, endpoint: str, signal_endpoint: str) -> int:
        """One more cell; its index (``CellsPort.add_cell``)."""
        index = len(self.cells)
        effects = self._new_cell(endpoint, late=True)
        self._subscriber.add(signal_endpoint)
        self.spawn(self._join(index))
        self.carry(effects)
        return index

    def _new_cell(self, endpoint: str, late: bool) -> list[Effect]:
        index, effects = self.membership.add(late)
        self.cells.append(RemoteController(endpoint, f"{self._name}/cell-{index}", self._secret,
                                           lambda: self.dead(index, "its channel closed")))  # fmt: skip
        return effects

    async def _join(self, index: int) -> None:
        cell = self.cells[index]
        try:
            await cell.start(self._join_timeout_s)
        except TimeoutError:  # its join stays queued: the cell takes it when it binds
            log.warning("cell %d did not answer within %g s", index, self._join_timeout_s)
            while not cell.joined and not self.membership.down(index):
                await asyncio.sleep(0.1)
        log.info("cell %d joined, with %d device(s)", index, cell.device_count)
        self.carry(self.membership.joined(index))

    async def _follow_cells_file(self, period_s: float = 0.5) -> None:
        """The cells the server lists (a JSON list of [endpoint, signal, departed]): new ones are added,
        departed ones dropped."""
        while True:
            await asyncio.sleep(period_s)
            self._sync_cells_file()

    def _sync_cells_file(self) -> None:
        assert self._cells_file is not None
        try:
            listed = json.loads(self._cells_file.read_text())
        except (OSError, ValueError):
            return  # not written yet
        for endpoint, signal_endpoint, _ in listed[len(self.cells) :]:
            self.add_cell(endpoint, signal_endpoint)
        for index, (_, _, departed) in enumerate(listed):
            if departed:
                self.depart(index, "the server says it left")

    def depart(self, index: int, why: str) -> None:
        """Cell ``index`` is gone for good (``CellsPort.depart``)."""
        self.carry(self.membership.departed(index, why))

    def dead(self, index: int, why: str) -> None:
        """Cell ``index``'s process is gone (``CellsPort.dead``)."""
        self.carry(self.membership.exited(index, why))

    def carry(self, effects: Sequence[Effect]) -> None:
        """What the membership decided, done."""
        for effect in effects:
            index, cell = effect.cell, self.cells[effect.cell]
            if effect.do is Do.FAIL_WAITING:
                failed = cell.fail_waiting(f"cell {index}'s controller is gone ({effect.text})")
                level = logging.WARNING if cell.accepting else logging.INFO  # not: it was stopping
                log.log(level, "cell %d is gone (%s): its models go to the other cells; %d call(s) it held are "
                        "tried elsewhere", index, effect.text, failed)  # fmt: skip
            elif effect.do is Do.DISCONNECT:
                self.spawn(cell.disconnect())
            elif effect.do is Do.REJOIN:
                self.spawn(self.rejoin(index))
            elif effect.do is Do.SETTLE:
                self.spawn(self.settler.settle(index))
            else:
                log.log(logging.WARNING if effect.do is Do.WARN else logging.INFO, "%s", effect.text)

    def spawn(self, work: Coroutine[Any, Any, object]) -> None:
        """Work in the background, cancelled at ``close``."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, period_s: float = 0.1) -> None:
        while True:
            await asyncio.sleep(period_s)
            self.carry(self.membership.tick())

    def on_signal(self, signal: CellSignal) -> None:
        """A cell's load signal: the membership hears from it, the router routes by it."""
        if not 0 <= signal.cell < len(self.cells) or self.membership.phase(signal.cell) is Phase.DEPARTED:
            return
        effects = self.membership.signal(signal.cell, signal.incarnation)
        self._router.publish(signal)
        self.carry(effects)

    async def rejoin(self, index: int) -> None:
        try:
            await self.cells[index].rejoin()
        except (TimeoutError, ServiceError) as error:
            self.carry(self.membership.rejoined(index, False, repr(error)))
        else:
            self.carry(self.membership.rejoined(index, True))
            log.info("cell %d has %d device(s)", index, self.cells[index].device_count)

    async def on_cell(self, index: int, call: CellCall) -> None:
        """``call`` on cell ``index``; refused by a new run of the cell (it never ran: the cell restarted
        since this frontend joined it), once more after joining it again, as ``CellsPort.infer`` does."""
        try:
            await call(self.cells[index])
        except ServiceError as error:
            if not error.never_ran or not self.membership.never_ran(index):  # gone, or a rejoin under way
                raise
            await self.rejoin(index)
            if self.membership.down(index):
                raise
            await call(self.cells[index])

    def serves(self, index: int, model: str) -> bool:
        """Cell ``index`` is up and serves ``model`` (a settling cell: as its settled peers do)."""
        cell = self.cells[index]
        if not self.membership.taken_in(index) or model not in cell.models:
            return False
        if not self._settles:
            return cell.in_line
        return self.settler.agrees(index, model)

    def reachable(self) -> list[RemoteController]:
        """The cells a call can reach (joined, not dead): the others would only make it wait out its bound."""
        return [self.cells[index] for index in self.membership.reachable()]

    async def close(self) -> None:
        await self._subscriber.close()  # first: no signal starts a rejoin while the rest closes
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(*(cell.close() for cell in self.cells), return_exceptions=True)
