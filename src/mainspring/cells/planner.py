"""The cells planner, one for ``serve --cells`` (``frontend/cells_port.py``) and ``simulate --cells``
(``sim/cells.py``): when to re-plan, the demand rates it plans from, which cells serve each model, the
handover of a model that gains a cell (served by its old and new cells while the new one warms it),
and the cell each request goes to.

Pure: integer ns, the time passed in, plain frozen data out. Its callers measure nothing of their own
and carry out what a ``Replan`` says (warm each ``warms`` entry on its cell).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from mainspring.cells.placement import CellCapacity, Placement, PlacementConfig, demand_of, plan
from mainspring.cells.routing import Costs, Router
from mainspring.models.profile import ModelProfile
from mainspring.protocol import DeviceSpec
from mainspring.time import NS_PER_S


@dataclass(frozen=True)
class PlannerConfig:
    first_replan_ns: int = NS_PER_S // 4  # then twice as far apart each time, up to ``replan_ns``
    replan_ns: int = 2 * NS_PER_S
    handover_ns: int = NS_PER_S  # a model that gains a cell is served by its old and new cells this long
    placement: PlacementConfig = field(default_factory=PlacementConfig)

    def __post_init__(self) -> None:
        if self.first_replan_ns <= 0 or self.replan_ns <= 0:
            raise ValueError("first_replan_ns and replan_ns must be positive")
        if self.handover_ns < 0:
            raise ValueError(f"handover_ns must not be negative, got {self.handover_ns}")


@dataclass(frozen=True)
class Handover:
    until_ns: int  # its old cells serve it before this, not from it on
    cells: tuple[int, ...]  # old and new, sorted


@dataclass(frozen=True)
class Replan:
    at_ns: int
    first: bool  # the plan at the start (nothing to hand over)
    rates: Mapping[str, float]  # requests/s per model, as planned from
    placement: Placement
    changed: tuple[str, ...]  # models that had cells and whose cells changed, sorted
    handovers: Mapping[str, Handover]  # begun at this re-plan
    warms: tuple[tuple[int, str], ...]  # (cell, model) to load before its requests come, sorted
    next_ns: int  # when the next re-plan is due


def capacity_of_specs(index: int, specs: Sequence[DeviceSpec]) -> CellCapacity:
    """A cell's capacity from its devices' specs: their weight pools together."""
    return CellCapacity(index, len(specs), sum(s.total_pages * s.page_bytes for s in specs))


class CellsPlanner:
    """Re-plans from measured demand on a schedule, and picks each request's cell (``router``)."""

    def __init__(self, config: PlannerConfig | None = None, start_ns: int = 0) -> None:
        self.config = config or PlannerConfig()
        self.router = Router()
        self.placement: Placement = {}
        self._handovers: dict[str, Handover] = {}
        self._arrivals: dict[str, int] = {}
        self._rates: dict[str, float] = {}
        self._last_ns: int | None = None  # the last re-plan
        self._interval_ns = 0
        self._next_ns = start_ns
        self.shared: dict[int, tuple[str, ...]] = {}  # cell -> models it serves with other cells (its signal)

    @property
    def next_replan_ns(self) -> int:
        """When the next re-plan is due: the start, a quarter second on, then twice as far apart each time
        up to ``replan_ns``, from each re-plan's time."""
        return self._next_ns

    def arrived(self, model: str, count: int = 1) -> None:
        """First tries (samples) toward ``model``'s rate."""
        self._arrivals[model] = self._arrivals.get(model, 0) + count

    def replan(self, now_ns: int, cells: Sequence[CellCapacity], models: Mapping[str, ModelProfile]) -> Replan | None:
        """New rates (the arrivals over the time measured since the last re-plan, halfway to the last
        rate), then the plan from the previous one; a model that had cells and gains one is handed over
        and warmed there. None when there is no model or no cell to plan (the rates and the schedule
        move on all the same)."""
        first = self._last_ns is None
        self._update_rates(now_ns)
        self._schedule_after(now_ns)
        if not models or not cells:
            return None
        demands = [demand_of(profile.renamed(name), self._rates.get(name, 0.0)) for name, profile in models.items()]
        placement = plan(cells, demands, self.placement, self.config.placement)
        changed, begun, warms = self._handover(now_ns, placement)
        self.placement = placement
        for name in [n for n, h in self._handovers.items() if h.until_ns <= now_ns]:
            del self._handovers[name]
        self._share(now_ns)
        rates = {name: self._rates.get(name, 0.0) for name in sorted(models)}
        return Replan(now_ns, first, rates, placement, changed, begun, warms, self._next_ns)

    def _update_rates(self, now_ns: int) -> None:
        elapsed_s = max(now_ns - (self._last_ns if self._last_ns is not None else now_ns), 1) / NS_PER_S
        self._last_ns = now_ns
        for name in sorted(set(self._rates) | set(self._arrivals)):
            measured = self._arrivals.get(name, 0) / elapsed_s
            self._rates[name] = measured if name not in self._rates else (self._rates[name] + measured) / 2
        self._arrivals.clear()

    def _schedule_after(self, now_ns: int) -> None:
        if self._interval_ns == 0:
            self._interval_ns = self.config.first_replan_ns
        else:
            self._interval_ns = min(2 * self._interval_ns, self.config.replan_ns)
        self._next_ns = now_ns + self._interval_ns

    def _handover(
        self, now_ns: int, placement: Placement
    ) -> tuple[tuple[str, ...], dict[str, Handover], tuple[tuple[int, str], ...]]:
        changed: list[str] = []
        begun: dict[str, Handover] = {}
        warms: list[tuple[int, str]] = []
        for name in sorted(placement):
            cells, old = placement[name], self.placement.get(name, ())
            if not old or cells == old:
                continue
            changed.append(name)
            gained = sorted(set(cells) - set(old))
            if gained:  # loaded there first, served by its old cells meanwhile (a drop has nothing to warm)
                begun[name] = Handover(now_ns + self.config.handover_ns, tuple(sorted({*old, *cells})))
                warms += [(cell, name) for cell in gained]
        self._handovers.update(begun)
        return tuple(changed), begun, tuple(sorted(warms))

    def _share(self, now_ns: int) -> None:
        shared: dict[int, list[str]] = {}
        for name in sorted(self.placement):
            cells = self._own(name, now_ns)
            if len(cells) > 1:
                for cell in cells:
                    shared.setdefault(cell, []).append(name)
        self.shared = {cell: tuple(models) for cell, models in shared.items()}

    def _own(self, model: str, now_ns: int) -> tuple[int, ...]:
        """The cells planned for ``model`` now: while it is handed over (before ``until_ns``), old and new."""
        handover = self._handovers.get(model)
        if handover is not None and now_ns < handover.until_ns:
            return handover.cells
        return self.placement.get(model, ())

    def candidates(self, model: str, now_ns: int, able: Collection[int], serving: Collection[int]) -> tuple[int, ...]:
        """``model``'s planned cells among ``able`` (cells that can take it now); else every able cell;
        else every cell in ``serving`` (those that serve it, silent ones too); else none."""
        placed = tuple(c for c in self._own(model, now_ns) if c in able)
        return placed or tuple(sorted(able)) or tuple(sorted(serving))

    def route(
        self, model: str, now_ns: int, able: Collection[int], serving: Collection[int], costs: Costs, count: int = 1
    ) -> int | None:
        """The cell for a request of ``count`` samples (counted toward the rate), or None: no candidate
        (then nothing is counted)."""
        cells = self.candidates(model, now_ns, able, serving)
        if not cells:
            return None
        self.arrived(model, count)
        return self.router.pick(model, cells, now_ns, costs)

    def retry(
        self,
        model: str,
        tried: int,
        now_ns: int,
        deadline_ns: int,
        able: Collection[int],
        serving: Collection[int],
        costs: Costs,
        meet_deadline: bool,
    ) -> int | None:
        """Another candidate than ``tried``, in the router's order: with ``meet_deadline`` only one whose
        signal says it ends by ``deadline_ns`` (a rejection tried again); else the first (a call that
        never ran). Not counted toward the rate: the first try was."""
        cells = self.candidates(model, now_ns, able, serving)
        if meet_deadline:
            return self.router.second_choice(model, cells, tried, now_ns, deadline_ns, costs)
        others = [c for c in cells if c != tried]
        return self.router.pick(model, others, now_ns, costs) if others else None
