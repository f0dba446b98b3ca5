"""The controller as a frontend sees it when the devices are split into cells (``serve --cells N``):
one ``ControllerPort`` over every cell's controller process.

Every cell serves every model of the repository (each loads it on its own devices when asked), so
placement only decides where requests go: the shared planner (``cells/planner.py``, the simulator's
too) gives each model its cells from the demand this frontend measured, re-planned every few seconds,
and picks among them the one whose load signal says a batch of one ends first. Which cells can take a
request is the membership's (``cells/membership.py``, carried out by ``cells_roster.py``): a cell whose
signal has not come for a second is taken as gone, and its models go to the others. A load, reload or
unload goes to every cell that is up; one that was down gets it when it returns, before it serves again
(``cells_settle.py``); statistics add up over the cells; the metrics get a ``cell`` label; the live page
shows every cell's devices.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mainspring.cells.placement import PlacementConfig
from mainspring.cells.planner import CellsPlanner, PlannerConfig, Replan
from mainspring.cells.routing import Costs, routing_costs
from mainspring.frontend.cells_metrics import cell_cursors, merge_expositions, merged_timeline, summed_statistics
from mainspring.frontend.cells_roster import CellRoster
from mainspring.frontend.cells_settle import CellCall
from mainspring.frontend.port import Answer, ServedModel, ServiceError
from mainspring.frontend.remote import RemoteController
from mainspring.protocol.tensors import Sample
from mainspring.telemetry.metrics import ModelStats
from mainspring.time import NS_PER_S, Clock, WallClock

log = logging.getLogger(__name__)

__all__ = ["CellsPort", "merge_expositions"]


class CellsPort:
    """``ControllerPort`` over the cells' controllers (``RemoteController`` each, on ``endpoints``): the
    planner decides where calls go and the membership which cells can take them (``CellRoster`` carries
    out what it says); this plans, routes and changes models on every cell (``clock``: the time they go by)."""

    def __init__(
        self,
        name: str,
        endpoints: Sequence[str],
        signal_endpoints: Sequence[str],
        placement: PlacementConfig | None = None,
        secret: str = "",
        cells_file: str = "",
        settles: bool = False,
        clock: Clock | None = None,
    ) -> None:
        self._clock = clock or WallClock()
        self.planner = CellsPlanner(PlannerConfig(placement=placement or PlacementConfig()), self._clock.now_ns())
        self.router = self.planner.router
        self._changing: dict[str, asyncio.Lock] = {}  # one repository change of a model at a time
        # The server's port brings a returning cell in line and then tells it; a frontend process's port
        # routes to a cell only once it says so (``RemoteController.in_line``).
        self.roster = CellRoster(name, endpoints, signal_endpoints, self.router, self._changing, self._clock,
                                 secret, cells_file, settles)  # fmt: skip
        self.membership = self.roster.membership
        self.cells = self.roster.cells

    async def start(self, timeout_s: float = 60.0) -> None:
        await self.roster.start(timeout_s)
        self._plan_tick()
        self.roster.spawn(self._plan_every())
        await self.roster.keep_up(timeout_s)

    def add_cell(self, endpoint: str, signal_endpoint: str) -> int:
        """One more cell (cells on Ray, as nodes join); its index. Requests go to it once it has joined,
        signalled and has devices (it settles first: it may miss a change made before it joined)."""
        return self.roster.add_cell(endpoint, signal_endpoint)

    def depart(self, index: int, why: str) -> None:
        """Cell ``index`` is gone for good (its node left): as ``dead``, and its models, devices and
        capacity count no more."""
        self.roster.depart(index, why)

    def dead(self, index: int, why: str) -> None:
        """Cell ``index``'s process is gone: requests go elsewhere, the calls it held fail now (to be tried
        on another cell while their deadlines allow), and what was queued for it is dropped."""
        self.roster.dead(index, why)

    async def close(self) -> None:
        await self.roster.close()

    # --- the placement and the routing ------------------------------------------------------------
    async def _plan_every(self) -> None:
        while True:
            await asyncio.sleep(max(self.planner.next_replan_ns - self._clock.now_ns(), 0) / NS_PER_S)
            self._plan_tick()

    def _plan_tick(self) -> Replan | None:
        """A re-plan over the cells' last reported devices and pools; the cells a model gains warm it."""
        for index in self.membership.present():
            cell = self.cells[index]
            self.membership.report(index, cell.device_count, cell.pool_bytes)
        profiles = {name: served.profile for name, served in self.models.items()}
        replan = self.planner.replan(self._clock.now_ns(), self.membership.capacities(), profiles)
        for index, model in replan.warms if replan is not None else ():
            self.roster.spawn(self._warm(index, model))
        if replan is not None:
            for index in self.membership.present():
                self.roster.spawn(self._tell_shared(index, self.planner.shared.get(index, ())))
        return replan

    async def _tell_shared(self, cell: int, models: Sequence[str]) -> None:
        try:
            await self.cells[cell].signal_models(models)
        except ServiceError as error:  # it signals every model meanwhile, as a cell not told does
            log.info("cell %d did not hear which models to signal: %s", cell, error)

    async def _warm(self, cell: int, model: str) -> bool:
        try:
            return await self.cells[cell].warm(model)
        except ServiceError as error:  # the cell will load it on its first request instead
            log.info("cell %d could not warm %s: %s", cell, model, error)
            return False

    def _route(self, model: str, count: int, now_ns: int, tried: int | None = None, deadline_ns: int = 0) -> int:
        """The cell for a call of ``count`` samples (a second try: another than ``tried``): among the
        cells live and serving it, the planned ones; else those serving it; else every cell still there."""
        serving = [
            c for c in self.membership.present() if self.cells[c].device_count > 0 and self.roster.serves(c, model)
        ]
        able = [c for c in serving if self.membership.is_live(c)]
        fallback = serving or self.membership.present()
        served = next((s for c in self.membership.present() if (s := self.cells[c].models.get(model)) is not None),
                      None)  # fmt: skip
        costs = routing_costs(served.profile) if served is not None else Costs(0, 0, 0)
        if tried is None:
            chosen = self.planner.route(model, now_ns, able, fallback, costs, count)
        else:
            chosen = self.planner.retry(model, tried, now_ns, deadline_ns, able, fallback, costs, meet_deadline=False)
        if chosen is None:
            raise ServiceError("unavailable", "no cell is up")
        return chosen

    # --- ControllerPort ---------------------------------------------------------------------------
    @property
    def models(self) -> Mapping[str, ServedModel]:
        """What the cells that are up serve (what a request can reach: ready agrees with infer). A view: a
        call's lookup asks each cell for its one model, not all the cells' models merged per call."""
        return _ServedByCells(self.cells, self.roster)

    @property
    def device_count(self) -> int:
        return sum(self.cells[index].device_count for index in self.membership.reachable())

    @property
    def accepting(self) -> bool:
        return any(self.cells[index].accepting for index in self.membership.present())

    @property
    def load_errors(self) -> Mapping[str, str]:
        merged: dict[str, str] = {}
        for index in self.membership.present():
            merged.update(self.cells[index].load_errors)
        return merged

    @property
    def default_slo_ns(self) -> int:
        return next((cell.default_slo_ns for cell in self.cells if cell.default_slo_ns), 0)

    async def refresh(self) -> bool:
        # one that died meanwhile is left to its restart (``dead``)
        await asyncio.gather(*(cell.refresh() for cell in self.roster.reachable()), return_exceptions=True)
        return True

    async def warm(self, model: str) -> bool:
        """Load ``model`` on its planned cells (every reachable one before a plan) before its requests come."""
        cells = self.planner.placement.get(model) or self.membership.reachable()
        return any(await asyncio.gather(*(self._warm(index, model) for index in cells)))

    async def infer(
        self, model: str, samples: Sequence[Sample], slo_ns: int, waited_ns: int = 0, traceparent: str = ""
    ) -> list[Answer]:
        now = self._clock.now_ns()
        chosen = self._route(model, len(samples), now)
        deadline = now - waited_ns + slo_ns
        try:
            waited_ns_there = waited_ns + self._clock.now_ns() - now
            return await self.cells[chosen].infer(model, samples, slo_ns, waited_ns_there, traceparent)
        except ServiceError as error:
            if not error.never_ran:
                raise
            # a live cell that no longer knows this frontend (its socket reconnected under a new identity):
            # joined again, as after a restart
            self.roster.carry(self.membership.never_ran(chosen))
            if deadline <= self._clock.now_ns():
                raise
            try:  # its cell died with it, or a new run of the cell refused it: it never ran there
                other = self._route(model, len(samples), self._clock.now_ns(), chosen, deadline)
            except ServiceError:
                raise error from None
            waited_ns_there = waited_ns + self._clock.now_ns() - now
            return await self.cells[other].infer(model, samples, slo_ns, waited_ns_there, traceparent)

    async def load_model(self, model: str, timeout_s: float = 120.0) -> None:
        await self._everywhere(lambda cell: cell.load_model(model, timeout_s), "load", model)

    async def reload_model(self, model: str, timeout_s: float = 120.0) -> None:
        await self._everywhere(lambda cell: cell.reload_model(model, timeout_s), "reload", model)

    async def unload_model(self, model: str, timeout_s: float = 60.0) -> None:
        await self._everywhere(lambda cell: cell.unload_model(model, timeout_s), "unload", model)

    async def _everywhere(self, call: CellCall, what: str, model: str) -> None:
        """Every reachable cell's call runs to its end; the first failure is raised after (a cell that
        failed keeps what it had, as one controller does). A cell that is down (or dies during the call)
        gets the change when it returns, before it serves again (``Settler``); with no cell up, 503."""
        async with self._changing.setdefault(model, asyncio.Lock()):
            reachable = self.membership.reachable()
            if not reachable:
                raise ServiceError("unavailable", f"no cell is up to {what} {model!r} (they are restarting): "
                                   "try again in a few seconds")  # fmt: skip
            if len(reachable) < len(self.membership.present()):
                log.warning("%s of %s reaches %d of %d cells; the others get it when they return", what, model,
                            len(reachable), len(self.membership.present()))  # fmt: skip
            results = await asyncio.gather(*(self.roster.on_cell(i, call) for i in reachable), return_exceptions=True)
        missed = [i for i, r in zip(reachable, results, strict=True) if isinstance(r, ServiceError) and r.never_ran
                  and self.membership.down(i)]  # fmt: skip
        if len(missed) == len(reachable):
            raise ServiceError("unavailable", f"every cell went down during the {what} of {model!r}: try again")
        if missed:
            log.warning("cells %s went down during the %s of %s: they get it when they return", missed, what, model)
        for index, result in zip(reachable, results, strict=True):
            if isinstance(result, BaseException) and index not in missed:
                raise result

    async def model_statistics(self, model: str) -> ModelStats:
        cells = self.roster.reachable()
        stats = await asyncio.gather(*(cell.model_statistics(model) for cell in cells), return_exceptions=True)
        return summed_statistics(stats)

    async def exposition(self) -> bytes:
        texts = await asyncio.gather(*(self._cell_exposition(i, cell) for i, cell in enumerate(self.cells)))
        return merge_expositions([t for t in texts if t is not None])

    async def _cell_exposition(self, index: int, cell: RemoteController) -> tuple[int, bytes] | None:
        if not self.membership.taken_in(index):
            return None
        try:
            return index, await cell.exposition()
        except ServiceError:
            return None  # a cell that is gone has no metrics to give

    async def timeline_view(self, seconds: float, cursor: str = "") -> dict[str, Any]:
        indices = self.membership.reachable()
        cursors = cell_cursors(cursor)
        views = await asyncio.gather(
            *(self.cells[i].timeline_view(seconds, cursors.get(i, "")) for i in indices), return_exceptions=True
        )
        return merged_timeline(seconds, list(zip(indices, views, strict=True)))

    def count_dropped_client(self, transport: str, cause: str) -> None:
        reachable = self.roster.reachable()
        if reachable:
            reachable[0].count_dropped_client(transport, cause)


class _ServedByCells(Mapping[str, ServedModel]):
    """The models the cells that are up serve, each as the first such cell serves it."""

    def __init__(self, cells: Sequence[RemoteController], roster: CellRoster) -> None:
        self._cells = cells
        self._roster = roster

    def __getitem__(self, name: str) -> ServedModel:
        for index, cell in enumerate(self._cells):
            served = cell.models.get(name)
            if served is not None and self._roster.serves(index, name):
                return served
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for index, cell in enumerate(self._cells):
            for name in cell.models:
                if name not in seen and self._roster.serves(index, name):
                    seen.add(name)
                    yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)
