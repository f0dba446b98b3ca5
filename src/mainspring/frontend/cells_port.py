"""The controller as a frontend sees it when the devices are split into cells (``serve --cells N``):
one ``ControllerPort`` over every cell's controller process.

Every cell serves every model of the repository (each loads it on its own devices when asked), so
placement only decides where requests go: the planner (``placement.py``) gives each model its cells
from the demand this frontend measured, re-planned every few seconds; among a model's cells the
router (``routing.py``) picks the one whose load signal says a batch of one ends first. A cell whose
signal has not come for ``STALE_S`` is taken as gone: its models go to the others, which can serve
them at once (the price is a cold load). A load, reload or unload goes to every cell that is up; one
that was down gets it when it returns, before it serves again (``cells_settle.py``); statistics add up
over the cells; the metrics get a ``cell`` label; the live page shows every cell's devices.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mainspring.cells.placement import CellCapacity, Placement, PlacementConfig, demand_of, plan
from mainspring.cells.routing import CellSignal, Costs, Router, routing_costs
from mainspring.cells.wire import SignalSubscriber
from mainspring.frontend.cells_metrics import merge_expositions, merged_timeline, summed_statistics
from mainspring.frontend.cells_settle import Change, Models, agrees, change_call, differences
from mainspring.frontend.port import Answer, ServedModel, ServiceError
from mainspring.frontend.remote import RemoteController
from mainspring.protocol.pages import DEFAULT_POOL_BYTES
from mainspring.protocol.tensors import Sample
from mainspring.telemetry.metrics import ModelStats

CellCall = Callable[[RemoteController], Awaitable[None]]  # a model operation, run on one cell (``cells_settle``)

log = logging.getLogger(__name__)

STALE_S = 1.0  # a cell silent this long is taken as gone
REPLAN_S = (0.25, 2.0)  # the first re-plan, and the longest interval between re-plans (doubling)
LISTED_JOIN_S = 10.0  # a frontend process waits this long at most for the cells listed at its start
HANDOVER_S = 1.0  # a model that moves is served by its old and new cells this long (the new one warms it)


class CellsPort:
    """``ControllerPort`` over the cells' controllers (``RemoteController`` each, on ``endpoints``).

    A cell is *silent* when its signal has not come for ``STALE_S``: no request goes to it, but what it
    holds is left to it (a slow cell still answers). It is *dead* when its process is known to have
    exited (``dead``, from the process that started it) or a signal comes from a new run of it: then
    the calls it held fail at once (it never answers them) and are tried on another cell, and its
    socket is replaced, so that nothing queued for the dead process reaches the next one."""

    def __init__(
        self,
        name: str,
        endpoints: Sequence[str],
        signal_endpoints: Sequence[str],
        placement: PlacementConfig | None = None,
        secret: str = "",
        cells_file: str = "",
        settles: bool = False,
    ) -> None:
        self._name = name
        # The server's port brings a returning cell in line and then tells it; a frontend process's port
        # routes to a cell only once it says so (``RemoteController.in_line``).
        self._settles = settles
        self._secret = secret  # the worker secret guards the cells' channels where they are TCP ports (Ray)
        self.cells = [self._channel(i, endpoint) for i, endpoint in enumerate(endpoints)]
        self._cells_file = Path(cells_file) if cells_file else None  # cells added later, listed by the server
        self._join_timeout_s = 60.0
        self.router = Router()
        self._placement_config = placement or PlacementConfig()
        self._subscriber = SignalSubscriber(list(signal_endpoints), self._signal, secret)
        self._seen: dict[int, int] = {}  # cell -> monotonic ns of its last signal
        self._incarnation: dict[int, int] = {}  # cell -> the run of its process that signalled last
        self._silent: set[int] = set()
        self._dead: set[int] = set()
        self._departed: set[int] = set()  # gone for good (its Ray node left): dead, and counted nowhere
        self._rejoining: set[int] = set()
        self._settling: set[int] = set()  # back from a restart, or joined late: serves only as its peers do
        self._changing: dict[str, asyncio.Lock] = {}  # one repository change of a model at a time
        self.placement: Placement = {}
        self._handover: dict[str, tuple[float, tuple[int, ...]]] = {}  # model -> (until, old and new cells)
        self._arrivals: Counter[str] = Counter()
        self._rates: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, timeout_s: float = 60.0) -> None:
        self._join_timeout_s = timeout_s
        self._subscriber.start()
        await asyncio.gather(*(cell.start(timeout_s) for cell in self.cells))
        if self._settles:  # the cells of the start: nothing to catch up on
            await asyncio.gather(*(cell.mark_in_line() for cell in self.cells))
        self._replan(REPLAN_S[0])
        self._spawn(self._plan_every())
        self._spawn(self._watch())
        if self._cells_file is not None:
            await self._join_listed(min(timeout_s, LISTED_JOIN_S))
            self._spawn(self._follow_cells_file())

    async def _join_listed(self, timeout_s: float) -> None:
        """The cells the server lists now, joined before this frontend takes requests (one that does not
        answer within ``timeout_s``, a cell still starting, is joined when it does)."""
        self._sync_cells_file()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
            not cell.joined for index, cell in enumerate(self.cells) if index not in self._dead
        ):
            await asyncio.sleep(0.02)

    def add_cell(self, endpoint: str, signal_endpoint: str) -> int:
        """One more cell (cells on Ray, as nodes join); its index. Requests go to it once it has joined,
        signalled and has devices."""
        index = len(self.cells)
        self.cells.append(self._channel(index, endpoint))
        self._subscriber.add(signal_endpoint)
        self._spawn(self._join(index))
        self._begin_settling(index)  # it may miss a change made before it joined
        return index

    async def _join(self, index: int) -> None:
        try:
            await self.cells[index].start(self._join_timeout_s)
        except TimeoutError:  # its join stays queued: the cell takes it when it binds
            log.warning("cell %d did not answer within %g s", index, self._join_timeout_s)
        else:
            log.info("cell %d joined, with %d device(s)", index, self.cells[index].device_count)

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
            if departed and index not in self._departed:
                self.depart(index, "the server says it left")

    def depart(self, index: int, why: str) -> None:
        """Cell ``index`` is gone for good (its node left): as ``dead``, and its models, devices and
        capacity count no more."""
        self.dead(index, why)
        self._departed.add(index)
        self._settling.discard(index)

    def _present(self) -> list[RemoteController]:
        """Every cell but the departed ones."""
        return [cell for index, cell in enumerate(self.cells) if index not in self._departed]

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, period_s: float = 0.1) -> None:
        while True:
            await asyncio.sleep(period_s)
            self.live_cells()

    def _channel(self, index: int, endpoint: str) -> RemoteController:
        """The channel to cell ``index``; a local cell's closing tells this port it died (``dead``)."""
        return RemoteController(endpoint, f"{self._name}/cell-{index}", self._secret,
                                lambda: self.dead(index, "its channel closed"))  # fmt: skip

    def dead(self, index: int, why: str) -> None:
        """Cell ``index``'s process is gone: requests go elsewhere, the calls it held fail now (to be tried
        on another cell while their deadlines allow), and what was queued for it is dropped."""
        if index in self._dead:
            return
        self._dead.add(index)
        self._begin_settling(index)
        failed = self.cells[index].fail_waiting(f"cell {index}'s controller is gone ({why})")
        if index not in self._rejoining:  # a rejoin under way replaces the socket itself
            self._spawn(self.cells[index].disconnect())
        level = logging.WARNING if self.cells[index].accepting else logging.INFO  # not: it was stopping
        log.log(level, "cell %d is gone (%s): its models go to the other cells; %d call(s) it held are tried "
                "elsewhere", index, why, failed)  # fmt: skip

    async def close(self) -> None:
        await self._subscriber.close()  # first: no signal starts a rejoin while the rest closes
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(*(cell.close() for cell in self.cells), return_exceptions=True)

    # --- the signal and the placement --------------------------------------------------------------
    def _signal(self, signal: CellSignal) -> None:
        index = signal.cell
        if not 0 <= index < len(self.cells) or index in self._departed:
            return
        known = self._incarnation.get(index)
        self._incarnation[index] = signal.incarnation
        if known is not None and known != signal.incarnation:
            self.dead(index, "it was restarted")  # whatever this frontend missed of its exit
        self.router.publish(signal)
        self._seen[index] = time.monotonic_ns()
        if index in self._silent:
            self._silent.discard(index)
            log.info("cell %d signals again", index)
        if index in self._dead and index not in self._rejoining:  # a new run: it knows this frontend no more
            self._rejoining.add(index)
            self._spawn(self._rejoin(index))

    async def _rejoin(self, index: int) -> None:
        try:
            await self.cells[index].rejoin()
        except (TimeoutError, ServiceError) as error:
            log.warning("cell %d did not take this frontend back: %r", index, error)
        else:
            if index in self._departed:  # it left while this ran: it stays gone
                await self.cells[index].disconnect()
                return
            self._dead.discard(index)
            log.info("cell %d is back, with %d device(s)", index, self.cells[index].device_count)
        finally:
            self._rejoining.discard(index)

    # --- a cell that returns: in line with the others before it serves (``cells_settle.py``) ------------
    def _begin_settling(self, index: int) -> None:
        if self._settles and index not in self._settling and index not in self._departed:
            self._settling.add(index)
            self._spawn(self._settle(index))

    def _settled_models(self, index: int) -> list[Models]:
        """What the settled cells other than ``index`` serve (up, joined, not settling themselves)."""
        return [cell.models for i, cell in enumerate(self.cells)
                if i != index and cell.joined and i not in self._dead and i not in self._settling]  # fmt: skip

    def _serves(self, index: int, model: str) -> bool:
        """Cell ``index`` is up and serves ``model`` (a settling cell: as its settled peers do)."""
        cell = self.cells[index]
        if index in self._dead or model not in cell.models:
            return False
        if not self._settles:
            return cell.in_line
        return index not in self._settling or agrees(model, cell.models, self._settled_models(index))

    async def _settle(self, index: int, period_s: float = 0.1) -> None:
        """Until cell ``index`` (up, with devices: its workers' models known) serves what its settled peers
        serve; the server's port makes each change it needs once per run of the cell."""
        tried: set[tuple[int, Change]] = set()
        while index in self._settling:
            cell = self.cells[index]
            if index not in self._dead and cell.joined and cell.device_count > 0:
                peers = self._settled_models(index)
                changes = differences(cell.models, peers) if peers else []
                if not changes and await self._mark_in_line(index):
                    return
                run = self._incarnation.get(index, 0)
                for change in [c for c in changes if (run, c) not in tried]:
                    tried.add((run, change))
                    await self._catch_up(index, change)
            await asyncio.sleep(period_s)

    async def _mark_in_line(self, index: int) -> bool:
        try:
            await self.cells[index].mark_in_line()  # the frontend processes route to it from now on
        except ServiceError:
            return False  # gone again: its next run is brought in line
        self._settling.discard(index)
        log.info("cell %d serves what the other cells serve: all its models take requests", index)
        return True

    async def _catch_up(self, index: int, change: Change) -> None:
        """Make on cell ``index`` a change the other cells had while it was down (if still wanted)."""
        what, model = change
        async with self._changing.setdefault(model, asyncio.Lock()):
            if change not in differences(self.cells[index].models, self._settled_models(index)):
                return  # a change through the API reached it meanwhile
            try:
                await self._on_cell(index, change_call(change))
            except ServiceError as error:
                log.warning("cell %d: the %s of %s it missed while down failed (it serves %s only as the "
                            "others do): %s", index, what, model, model, error)  # fmt: skip
            else:
                log.info("cell %d: the %s of %s made while it was down is done there too", index, what, model)

    def live_cells(self) -> list[int]:
        """Cells neither dead nor silent (their signal came within ``STALE_S``)."""
        now = time.monotonic_ns()
        live = []
        for index in range(len(self.cells)):
            if index in self._dead:
                continue
            if now - self._seen.get(index, 0) <= STALE_S * 1e9:
                live.append(index)
            elif index in self._seen and index not in self._silent:
                self._silent.add(index)
                log.warning("cell %d sent no load signal for %g s: no new request goes to it", index, STALE_S)
        return live

    def _reachable(self) -> list[RemoteController]:
        """The cells a call can reach (joined, not dead): the others would only make it wait out its bound."""
        return [self.cells[index] for index in self._reachable_indices()]

    def _reachable_indices(self) -> list[int]:
        return [index for index, cell in enumerate(self.cells) if index not in self._dead and cell.joined]

    async def _plan_every(self) -> None:
        interval = REPLAN_S[0]
        while True:
            await asyncio.sleep(interval)
            self._replan(interval)
            interval = min(2 * interval, REPLAN_S[1])

    def _replan(self, seconds: float) -> None:
        for name in set(self._rates) | set(self._arrivals):
            measured = self._arrivals.get(name, 0) / seconds
            self._rates[name] = measured if name not in self._rates else (self._rates[name] + measured) / 2
        self._arrivals.clear()
        models = self.models
        if not models:
            return
        capacities = [
            CellCapacity(i, max(1, cell.device_count), max(1, cell.device_count) * DEFAULT_POOL_BYTES)
            for i, cell in enumerate(self.cells)
            if i not in self._departed
        ]
        if not capacities:
            return
        demands = [demand_of(m.profile.renamed(name), self._rates.get(name, 0.0)) for name, m in models.items()]
        placement = plan(capacities, demands, self.placement, self._placement_config)
        now = time.monotonic()
        for name, cells in placement.items():
            old = self.placement.get(name, ())
            gained = [c for c in cells if c not in old]
            if old and gained:  # a move or a new replica: loaded there first, served by both meanwhile
                self._handover[name] = (now + HANDOVER_S, tuple(sorted({*old, *cells})))
                for cell in gained:
                    self._spawn(self._warm(cell, name))
        self.placement = placement
        for name in [n for n, (until, _) in self._handover.items() if until <= now]:
            del self._handover[name]

    async def _warm(self, cell: int, model: str) -> None:
        try:
            await self.cells[cell].warm(model)
        except ServiceError as error:  # the cell will load it on its first request instead
            log.info("cell %d could not warm %s: %s", cell, model, error)

    def _cells_for(self, model: str) -> list[int]:
        """The model's cells that are live and serve it (while it moves, its old cells too; a restarted
        cell serves nothing until its workers are back); else any reachable cell that serves it (a
        frontend that has heard no signal yet); else every cell still there."""
        cells = self.cells
        serving = [c for c in range(len(cells)) if cells[c].device_count > 0 and self._serves(c, model)]
        live = set(self.live_cells())
        able = [c for c in serving if c in live]
        handover = self._handover.get(model)
        own = handover[1] if handover is not None and handover[0] > time.monotonic() else self.placement.get(model, ())
        placed = [c for c in own if c in able]
        return placed or able or serving or [c for c in range(len(cells)) if c not in self._departed]

    # --- ControllerPort ---------------------------------------------------------------------------
    @property
    def models(self) -> Mapping[str, ServedModel]:
        """What the cells that are up serve (what a request can reach: ready agrees with infer)."""
        merged: dict[str, ServedModel] = {}
        for index, cell in enumerate(self.cells):
            for name, served in cell.models.items():
                if name not in merged and self._serves(index, name):
                    merged[name] = served
        return merged

    @property
    def device_count(self) -> int:
        return sum(cell.device_count for index, cell in enumerate(self.cells) if index not in self._dead)

    @property
    def accepting(self) -> bool:
        return any(cell.accepting for cell in self._present())

    @property
    def load_errors(self) -> Mapping[str, str]:
        merged: dict[str, str] = {}
        for cell in self._present():
            merged.update(cell.load_errors)
        return merged

    @property
    def default_slo_ns(self) -> int:
        return next((cell.default_slo_ns for cell in self.cells if cell.default_slo_ns), 0)

    async def refresh(self) -> bool:
        # one that died meanwhile is left to its restart (``dead``)
        await asyncio.gather(*(cell.refresh() for cell in self._reachable()), return_exceptions=True)
        return True

    async def infer(self, model: str, samples: Sequence[Sample], slo_ns: int | None = None) -> list[Answer]:
        candidates = self._cells_for(model)
        if not candidates:
            raise ServiceError("unavailable", "no cell is up")
        self._arrivals[model] += len(samples)
        served = next((s for cell in self._present() if (s := cell.models.get(model)) is not None), None)
        costs = routing_costs(served.profile) if served is not None else Costs(0, 0, 0)
        now = time.monotonic_ns()
        deadline = now + (slo_ns if slo_ns is not None else self.default_slo_ns)
        chosen = self.router.pick(model, candidates, now, costs)
        try:
            return await self.cells[chosen].infer(model, samples, slo_ns)
        except ServiceError as error:
            others = [c for c in self._cells_for(model) if c != chosen]
            if error.never_ran and chosen not in self._dead and chosen not in self._rejoining:
                # a live cell that no longer knows this frontend (its socket reconnected under a new
                # identity): join it again, as after a restart
                self._rejoining.add(chosen)
                self._spawn(self._rejoin(chosen))
            if not error.never_ran or not others:
                raise
            left = deadline - time.monotonic_ns()
            if left <= 0:
                raise
            # its cell died with it, or a new run of the cell refused it: it never ran there
            return await self.cells[others[0]].infer(model, samples, left)

    async def load_model(self, model: str, timeout_s: float = 120.0) -> None:
        await self._everywhere(lambda cell: cell.load_model(model, timeout_s), "load", model)

    async def reload_model(self, model: str, timeout_s: float = 120.0) -> None:
        await self._everywhere(lambda cell: cell.reload_model(model, timeout_s), "reload", model)

    async def unload_model(self, model: str, timeout_s: float = 60.0) -> None:
        await self._everywhere(lambda cell: cell.unload_model(model, timeout_s), "unload", model)

    async def _everywhere(self, call: CellCall, what: str, model: str) -> None:
        """Every reachable cell's call runs to its end; the first failure is raised after (a cell that
        failed keeps what it had, as one controller does). A cell that is down (or dies during the call)
        gets the change when it returns, before it serves again (``_settle``); with no cell up, 503."""
        async with self._changing.setdefault(model, asyncio.Lock()):
            reachable = self._reachable_indices()
            if not reachable:
                raise ServiceError("unavailable", f"no cell is up to {what} {model!r} (they are restarting): "
                                   "try again in a few seconds")  # fmt: skip
            if len(reachable) < len(self._present()):
                log.warning("%s of %s reaches %d of %d cells; the others get it when they return", what, model,
                            len(reachable), len(self._present()))  # fmt: skip
            results = await asyncio.gather(*(self._on_cell(i, call) for i in reachable), return_exceptions=True)
        missed = [i for i, r in zip(reachable, results, strict=True) if isinstance(r, ServiceError) and r.never_ran
                  and i in self._dead]  # fmt: skip
        if len(missed) == len(reachable):
            raise ServiceError("unavailable", f"every cell went down during the {what} of {model!r}: try again")
        if missed:
            log.warning("cells %s went down during the %s of %s: they get it when they return", missed, what, model)
        for index, result in zip(reachable, results, strict=True):
            if isinstance(result, BaseException) and index not in missed:
                raise result

    async def _on_cell(self, index: int, call: CellCall) -> None:
        """``call`` on cell ``index``; refused by a new run of the cell (it never ran: the cell restarted
        since this frontend joined it), once more after joining it again, as ``infer`` does."""
        try:
            await call(self.cells[index])
        except ServiceError as error:
            if not error.never_ran or index in self._dead or index in self._rejoining:
                raise
            self._rejoining.add(index)
            await self._rejoin(index)
            if index in self._dead or index in self._departed:
                raise
            await call(self.cells[index])

    async def model_statistics(self, model: str) -> ModelStats:
        cells = self._reachable()
        stats = await asyncio.gather(*(cell.model_statistics(model) for cell in cells), return_exceptions=True)
        return summed_statistics(stats)

    async def exposition(self) -> bytes:
        texts = await asyncio.gather(*(self._cell_exposition(i, cell) for i, cell in enumerate(self.cells)))
        return merge_expositions([t for t in texts if t is not None])

    async def _cell_exposition(self, index: int, cell: RemoteController) -> tuple[int, bytes] | None:
        if index in self._dead:
            return None
        try:
            return index, await cell.exposition()
        except ServiceError:
            return None  # a cell that is gone has no metrics to give

    async def timeline_view(self, seconds: float) -> dict[str, Any]:
        indices = [i for i in range(len(self.cells)) if i not in self._dead]
        views = await asyncio.gather(*(self.cells[i].timeline_view(seconds) for i in indices), return_exceptions=True)
        return merged_timeline(seconds, list(zip(indices, views, strict=True)))

    def count_dropped_client(self, transport: str, cause: str) -> None:
        reachable = self._reachable()
        if reachable:
            reachable[0].count_dropped_client(transport, cause)
