"""A cell that comes back (its controller restarted) or joins late is brought in line with the other
cells before it serves: a repository change made while it was down (a load, reload or unload through the
API reaches only the cells that are up) is applied to it when it returns. Without this, a restarted cell
served again a model the user had unloaded (its workers still held it), 200 having been answered.

Until then the cell is *settling*: the server's port sends it a model's requests only where a settled peer
serves that model at the same version and config (with no settled peer there is nothing to compare with:
it serves what it holds), and makes the changes it missed; then it tells the cell, whose state says so to
every frontend (``in_line``). A frontend process's port routes to a cell only once it is in line: a cell
(re)started is not, until then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from mainspring.cells.membership import Membership
from mainspring.frontend.port import ServedModel, ServiceError
from mainspring.frontend.remote import RemoteController

LOAD, RELOAD, UNLOAD = "load", "reload", "unload"
Change = tuple[str, str]  # (LOAD, RELOAD or UNLOAD; the model)
Models = Mapping[str, ServedModel]
CellCall = Callable[[RemoteController], Awaitable[None]]  # a model operation, run on one cell

log = logging.getLogger(__name__)


def same(one: ServedModel, other: ServedModel) -> bool:
    return one.version == other.version and one.config == other.config


def differences(own: Models, peers: Sequence[Models]) -> list[Change]:
    """What a cell serving ``own`` must change to serve what its settled ``peers`` serve: unload a model
    none serves, load one it lacks, reload one it serves at another version or config."""
    changes: list[Change] = []
    for name in sorted(own):
        served = [peer[name] for peer in peers if name in peer]
        if not served:
            changes.append((UNLOAD, name))
        elif not any(same(own[name], other) for other in served):
            changes.append((RELOAD, name))
    wanted = {name for peer in peers for name in peer}
    changes += [(LOAD, name) for name in sorted(wanted - set(own))]
    return changes


def agrees(model: str, own: Models, peers: Sequence[Models]) -> bool:
    """``own`` serves ``model`` as a settled peer does (or there is no peer to ask)."""
    served = own.get(model)
    if served is None:
        return False
    return not peers or any(same(served, peer[model]) for peer in peers if model in peer)


def change_call(change: Change) -> CellCall:
    """What makes ``change`` on one cell."""
    what, model = change
    if what == LOAD:
        return lambda cell: cell.load_model(model)
    if what == RELOAD:
        return lambda cell: cell.reload_model(model)
    return lambda cell: cell.unload_model(model)


class Settler:
    """Brings each settling cell in line (the server's port): the changes it missed, once per run of the
    cell, then it is told it is in line. ``changing``: the port's lock per model, one change at a time;
    ``on_cell``: the port's call on one cell (joined again where the cell no longer knows the port)."""

    def __init__(
        self,
        cells: Sequence[RemoteController],
        membership: Membership,
        changing: dict[str, asyncio.Lock],
        on_cell: Callable[[int, CellCall], Awaitable[None]],
    ) -> None:
        self._cells = cells
        self._membership = membership
        self._changing = changing
        self._on_cell = on_cell

    def _settling(self, index: int) -> bool:
        return self._membership.members[index].settling

    def settled_models(self, index: int) -> list[Models]:
        """What the settled cells other than ``index`` serve (up, joined, not settling themselves)."""
        return [cell.models for i, cell in enumerate(self._cells)
                if i != index and self._membership.taken_in(i) and not self._settling(i)]  # fmt: skip

    def agrees(self, index: int, model: str) -> bool:
        """Cell ``index`` may serve ``model``: settled, or serving it as its settled peers do."""
        return not self._settling(index) or agrees(model, self._cells[index].models, self.settled_models(index))

    async def settle(self, index: int, period_s: float = 0.1) -> None:
        """Until cell ``index`` (up, with devices: its workers' models known) serves what its settled peers
        serve; each change it needs is made once per run of the cell."""
        tried: set[tuple[int, Change]] = set()
        while self._settling(index):
            cell = self._cells[index]
            if self._membership.taken_in(index) and cell.device_count > 0:
                peers = self.settled_models(index)
                changes = differences(cell.models, peers) if peers else []
                if not changes and await self._mark_in_line(index):
                    return
                run = self._membership.members[index].incarnation or 0
                for change in [c for c in changes if (run, c) not in tried]:
                    tried.add((run, change))
                    await self._catch_up(index, change)
            await asyncio.sleep(period_s)

    async def _mark_in_line(self, index: int) -> bool:
        try:
            await self._cells[index].mark_in_line()  # the frontend processes route to it from now on
        except ServiceError:
            return False  # gone again: its next run is brought in line
        self._membership.settled(index)
        log.info("cell %d serves what the other cells serve: all its models take requests", index)
        return True

    async def _catch_up(self, index: int, change: Change) -> None:
        """Make on cell ``index`` a change the other cells had while it was down (if still wanted)."""
        what, model = change
        async with self._changing.setdefault(model, asyncio.Lock()):
            if change not in differences(self._cells[index].models, self.settled_models(index)):
                return  # a change through the API reached it meanwhile
            try:
                await self._on_cell(index, change_call(change))
            except ServiceError as error:
                log.warning("cell %d: the %s of %s it missed while down failed (it serves %s only as the "
                            "others do): %s", index, what, model, model, error)  # fmt: skip
            else:
                log.info("cell %d: the %s of %s made while it was down is done there too", index, what, model)
