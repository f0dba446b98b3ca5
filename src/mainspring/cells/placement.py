"""Which cells serve each model: a home for every model, spread by demand and weight size, and more
cells for a model busier than a share of one cell.

Pure code, used live and in the simulator. A plan is greedy (the busiest replica first, onto the
cell it leaves least full) followed by moves that lower the busiest cell. A re-plan starts from the
previous placement and changes it only past the hysteresis: a replica is added or dropped only when
demand leaves the band around its threshold, and models move only while the busiest cell is more
than ``hysteresis`` above the mean, or a cell is over its pool, at most ``max_moves`` at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from mainspring.cells.routing import routing_costs
from mainspring.models.profile import ModelProfile
from mainspring.time import NS_PER_S

Placement = dict[str, tuple[int, ...]]  # model -> the cells that serve it, sorted
# A cell's devices at most, by default (serve sizes its cells by it, plan splits by it): what one
# controller core keeps up with (docs/sizing.md).
CELL_DEVICES = 16
TIE = 1e-9  # fills this close are equal: sums added in another order must not decide a move


@dataclass(frozen=True)
class CellCapacity:
    cell: int
    devices: int
    pool_bytes: int  # its devices' weight pools together

    def __post_init__(self) -> None:
        if self.devices <= 0 or self.pool_bytes <= 0:
            raise ValueError(f"cell {self.cell}: devices and pool_bytes must be positive")


@dataclass(frozen=True)
class ModelDemand:
    model: str
    weights_bytes: int
    rate_rps: float = 0.0  # measured arrivals
    work_ns: int = 0  # device time per request in a full batch

    @property
    def load(self) -> float:
        """Devices this model keeps busy."""
        return self.rate_rps * self.work_ns / NS_PER_S


def demand_of(profile: ModelProfile, rate_rps: float) -> ModelDemand:
    """A model's demand at ``rate_rps``, its work per request that of its most efficient batch."""
    return ModelDemand(profile.model, profile.weights_bytes, rate_rps, routing_costs(profile).work_ns)


@dataclass(frozen=True)
class PlacementConfig:
    replica_share: float = 0.5  # a model busier than this share of one cell's devices gets another cell
    hysteresis: float = 0.25
    max_moves: int = 64  # per re-plan; a first plan moves as many as it takes

    def __post_init__(self) -> None:
        if not 0 < self.replica_share <= 1:
            raise ValueError(f"replica_share must be in (0, 1], got {self.replica_share}")
        if not 0 <= self.hysteresis < 1:
            raise ValueError(f"hysteresis must be in [0, 1), got {self.hysteresis}")
        if self.max_moves < 0:
            raise ValueError(f"max_moves must not be negative, got {self.max_moves}")


class _Fill:
    """Load and bytes per cell as replicas are placed."""

    def __init__(self, cells: Sequence[CellCapacity]) -> None:
        self.cells = {c.cell: c for c in cells}
        self.load = {c.cell: 0.0 for c in cells}
        self.bytes = {c.cell: 0 for c in cells}

    def add(self, cell: int, load: float, size: int) -> None:
        self.load[cell] += load
        self.bytes[cell] += size

    def remove(self, cell: int, load: float, size: int) -> None:
        self.load[cell] -= load
        self.bytes[cell] -= size

    def load_fill(self, cell: int, extra: float = 0.0) -> float:
        return (self.load[cell] + extra) / self.cells[cell].devices

    def over_pool(self, cell: int, extra: int = 0) -> bool:
        return self.bytes[cell] + extra > self.cells[cell].pool_bytes

    def key(self, cell: int, load: float, size: int) -> tuple[bool, float, int]:
        """Where a replica goes: a cell it fits first, then the one it leaves least full."""
        bytes_fill = (self.bytes[cell] + size) / self.cells[cell].pool_bytes
        return self.over_pool(cell, size), max(self.load_fill(cell, load), bytes_fill), cell


def replica_count(load: float, cell_devices: int, cells: int, config: PlacementConfig, previous: int = 0) -> int:
    """How many cells a model of ``load`` needs; with ``previous``, kept unless demand is past the band."""
    per_cell = config.replica_share * cell_devices
    wanted = min(cells, max(1, math.ceil(load / per_cell)))
    if previous <= 0:
        return wanted
    previous = min(previous, cells)
    band = config.hysteresis
    if wanted > previous and load > previous * per_cell * (1 + band):
        return wanted
    if wanted < previous and load < (previous - 1) * per_cell * (1 - band):
        return wanted
    return previous


def plan(
    cells: Sequence[CellCapacity],
    demands: Iterable[ModelDemand],
    previous: Mapping[str, Sequence[int]] | None = None,
    config: PlacementConfig | None = None,
) -> Placement:
    """The cells of every model in ``demands`` (each at least one; none twice)."""
    config = config or PlacementConfig()
    if not cells:
        raise ValueError("placement needs at least one cell")
    by_model = {d.model: d for d in demands}
    smallest = min(c.devices for c in cells)
    fill = _Fill(cells)
    placement: dict[str, list[int]] = {}
    unplaced: list[tuple[ModelDemand, int]] = []  # (model, replicas it still needs)
    for name in sorted(by_model):
        demand = by_model[name]
        kept = sorted({c for c in (previous or {}).get(name, ()) if c in fill.cells})
        count = replica_count(demand.load, smallest, len(cells), config, len(kept))
        while len(kept) > count:  # drop the replica on the busiest cell
            kept.remove(max(kept, key=lambda c: (fill.load_fill(c), c)))
        placement[name] = kept
        for cell in kept:
            fill.add(cell, demand.load / count, demand.weights_bytes)
        if count > len(kept):
            unplaced.append((demand, count))
    for demand, count in sorted(unplaced, key=lambda u: (-u[0].load / u[1], -u[0].weights_bytes, u[0].model)):
        share = demand.load / count
        while len(placement[demand.model]) < count:
            free = [c for c in fill.cells if c not in placement[demand.model]]
            cell = min(free, key=lambda c: fill.key(c, share, demand.weights_bytes))
            placement[demand.model].append(cell)
            fill.add(cell, share, demand.weights_bytes)
    moves = config.max_moves if previous else len(by_model) * len(cells)
    _rebalance(placement, by_model, fill, config, moves)
    return {name: tuple(sorted(cells_of)) for name, cells_of in placement.items()}


def _rebalance(
    placement: dict[str, list[int]],
    by_model: Mapping[str, ModelDemand],
    fill: _Fill,
    config: PlacementConfig,
    moves: int,
) -> None:
    """Move replicas off the busiest cell (or a cell over its pool) while that helps."""
    total_devices = sum(c.devices for c in fill.cells.values())
    mean = sum(fill.load.values()) / total_devices
    held: dict[int, set[str]] = {cell: set() for cell in fill.cells}
    for name, cells in placement.items():
        for cell in cells:
            held[cell].add(name)
    while moves > 0:
        move = _pool_move(placement, held, by_model, fill) or _load_move(placement, held, by_model, fill, mean, config)
        if move is None:
            return
        name, source, target = move
        demand = by_model[name]
        share = demand.load / len(placement[name])
        fill.remove(source, share, demand.weights_bytes)
        fill.add(target, share, demand.weights_bytes)
        placement[name][placement[name].index(source)] = target
        held[source].discard(name)
        held[target].add(name)
        moves -= 1


def _pool_move(
    placement: Mapping[str, list[int]],
    held: Mapping[int, set[str]],
    by_model: Mapping[str, ModelDemand],
    fill: _Fill,
) -> tuple[str, int, int] | None:
    """The idlest model of a cell over its pool, to the cell with the most room that it fits."""
    for source in sorted(fill.cells):
        if not fill.over_pool(source):
            continue
        for name in sorted(held[source], key=lambda n: (by_model[n].load, n)):
            size = by_model[name].weights_bytes
            room = [c for c in fill.cells if c not in placement[name] and not fill.over_pool(c, size)]
            if room:
                return name, source, max(room, key=lambda c: (fill.cells[c].pool_bytes - fill.bytes[c], -c))
    return None


def _load_move(
    placement: Mapping[str, list[int]],
    held: Mapping[int, set[str]],
    by_model: Mapping[str, ModelDemand],
    fill: _Fill,
    mean: float,
    config: PlacementConfig,
) -> tuple[str, int, int] | None:
    """The busiest replica of the busiest cell, past the band, that lowers it without making the target
    the busiest, onto the idlest cell it fits."""
    source = max(fill.cells, key=lambda c: (fill.load_fill(c), -c))
    if mean <= 0 or fill.load_fill(source) <= mean * (1 + config.hysteresis):
        return None
    for name in sorted(held[source], key=lambda n: (-by_model[n].load / len(placement[n]), n)):
        demand = by_model[name]
        share = demand.load / len(placement[name])
        if share <= 0:
            break
        targets = [
            c
            for c in fill.cells
            if c not in placement[name]
            and not fill.over_pool(c, demand.weights_bytes)
            and fill.load_fill(c, share) < fill.load_fill(source) - TIE
        ]
        if targets:
            return name, source, min(targets, key=lambda c: (fill.load_fill(c, share), c))
    return None


def cells_of_bytes(placement: Mapping[str, Sequence[int]], sizes: Mapping[str, int]) -> dict[int, int]:
    """The weight bytes each cell is given."""
    held: dict[int, int] = {}
    for name, cells in placement.items():
        for cell in cells:
            held[cell] = held.get(cell, 0) + sizes[name]
    return held
