"""The placement planner: every model has a cell, no pool is over-committed, re-plans keep to the hysteresis."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mainspring.cells.placement import (
    CellCapacity,
    ModelDemand,
    Placement,
    PlacementConfig,
    cells_of_bytes,
    plan,
    replica_count,
)

GIB = 1 << 30
CONFIG = PlacementConfig()

cell_lists = st.lists(
    st.builds(CellCapacity, st.just(0), st.integers(1, 16), st.integers(4 * GIB, 64 * GIB)), min_size=1, max_size=8
).map(lambda cells: [CellCapacity(i, c.devices, c.pool_bytes) for i, c in enumerate(cells)])
demand_lists = st.lists(
    st.builds(
        ModelDemand,
        st.just(""),
        st.integers(1 << 20, GIB),
        st.one_of(st.just(0.0), st.floats(0, 20_000)),
        st.integers(100_000, 20_000_000),
    ),
    min_size=1,
    max_size=60,
).map(lambda ds: [ModelDemand(f"m{i}", d.weights_bytes, d.rate_rps, d.work_ns) for i, d in enumerate(ds)])


def fills(cells: list[CellCapacity], demands: list[ModelDemand], placement: Placement) -> dict[int, float]:
    by_model = {d.model: d for d in demands}
    load = {c.cell: 0.0 for c in cells}
    for name, held in placement.items():
        for cell in held:
            load[cell] += by_model[name].load / len(held)
    return {c.cell: load[c.cell] / c.devices for c in cells}


def over_pool(cells: list[CellCapacity], demands: list[ModelDemand], placement: Placement) -> bool:
    held = cells_of_bytes(placement, {d.model: d.weights_bytes for d in demands})
    return any(held.get(c.cell, 0) > c.pool_bytes for c in cells)


@settings(max_examples=200, deadline=None)
@given(cells=cell_lists, demands=demand_lists)
def test_every_model_has_distinct_cells_and_as_many_as_its_demand_needs(
    cells: list[CellCapacity], demands: list[ModelDemand]
) -> None:
    placement = plan(cells, demands)
    assert set(placement) == {d.model for d in demands}
    smallest = min(c.devices for c in cells)
    for demand in demands:
        held = placement[demand.model]
        assert held and len(set(held)) == len(held), held
        assert set(held) <= {c.cell for c in cells}
        assert len(held) == replica_count(demand.load, smallest, len(cells), CONFIG)


@settings(max_examples=200, deadline=None)
@given(cells=cell_lists, demands=demand_lists)
def test_no_pool_is_over_committed_when_the_models_fit_with_room(
    cells: list[CellCapacity], demands: list[ModelDemand]
) -> None:
    """Whenever the replicas' weights take at most half of all pools and each model at most half of the
    smallest pool, some cell always has room: none may be over."""
    placement = plan(cells, demands)
    sizes = {d.model: d.weights_bytes for d in demands}
    total = sum(sizes[m] * len(held) for m, held in placement.items())
    smallest_pool = min(c.pool_bytes for c in cells)
    if total <= sum(c.pool_bytes for c in cells) / 2 and max(sizes.values()) <= smallest_pool / 2:
        assert not over_pool(cells, demands, placement)


@settings(max_examples=200, deadline=None)
@given(cells=cell_lists, demands=demand_lists)
def test_a_first_plan_leaves_no_move_that_would_lower_the_busiest_cell(
    cells: list[CellCapacity], demands: list[ModelDemand]
) -> None:
    placement = plan(cells, demands)
    fill = fills(cells, demands, placement)
    mean = sum(d.load for d in demands) / sum(c.devices for c in cells)
    busiest = max(fill, key=lambda c: (fill[c], -c))
    if mean == 0 or fill[busiest] <= mean * (1 + CONFIG.hysteresis):
        return
    by_model = {d.model: d for d in demands}
    devices = {c.cell: c.devices for c in cells}
    sizes = {d.model: d.weights_bytes for d in demands}
    held_bytes = cells_of_bytes(placement, sizes)
    pools = {c.cell: c.pool_bytes for c in cells}
    for name, held in placement.items():
        if busiest not in held:
            continue
        share = by_model[name].load / len(held)
        for target in devices:
            fits = held_bytes.get(target, 0) + sizes[name] <= pools[target]
            if target not in held and fits and share > 0:
                assert fill[target] + share / devices[target] >= fill[busiest] - 1e-9, (name, busiest, target)


@settings(max_examples=200, deadline=None)
@given(cells=cell_lists, demands=demand_lists, same=st.booleans(), scale=st.floats(0.5, 2.0))
def test_a_re_plan_moves_models_only_past_the_hysteresis(
    cells: list[CellCapacity], demands: list[ModelDemand], same: bool, scale: float
) -> None:
    first = plan(cells, demands)
    again = demands if same else [ModelDemand(d.model, d.weights_bytes, d.rate_rps * scale, d.work_ns) for d in demands]
    second = plan(cells, again, first)
    if same:
        assert second == first  # nothing changed: nothing moves
    smallest = min(c.devices for c in cells)
    fill = fills(cells, again, first)  # the old placement under the new demand
    mean = sum(d.load for d in again) / sum(c.devices for c in cells)
    past_band = mean > 0 and max(fill.values()) > mean * (1 + CONFIG.hysteresis)
    counts = {d.model: replica_count(d.load, smallest, len(cells), CONFIG, len(first[d.model])) for d in again}
    recounted = any(counts[m] != len(first[m]) for m in counts)  # past their own band: the fills move
    moved = 0
    for demand in again:
        before, after = first[demand.model], second[demand.model]
        assert len(after) == counts[demand.model]
        if len(before) == counts[demand.model] and set(before) != set(after):
            moved += 1
            assert recounted or past_band or over_pool(cells, again, first), demand.model
    assert moved <= CONFIG.max_moves


def test_a_replica_is_added_only_past_the_band_and_dropped_only_below_it() -> None:
    # one cell of 8 devices takes 4 devices of one model (share 0.5); the band is 25% either way
    assert replica_count(4.0, 8, 4, CONFIG) == 1
    assert replica_count(4.5, 8, 4, CONFIG) == 2  # a first plan: no band
    assert replica_count(4.5, 8, 4, CONFIG, previous=1) == 1  # inside the band: kept at one
    assert replica_count(5.1, 8, 4, CONFIG, previous=1) == 2
    assert replica_count(3.5, 8, 4, CONFIG, previous=2) == 2  # inside the band: kept at two
    assert replica_count(2.9, 8, 4, CONFIG, previous=2) == 1
    assert replica_count(100.0, 8, 3, CONFIG) == 3  # never more than the cells


def test_a_hot_model_is_spread_over_cells_and_the_rest_balance_around_it() -> None:
    cells = [CellCapacity(i, 4, 64 * GIB) for i in range(4)]
    hot = ModelDemand("hot", GIB // 10, 6_000, 1_000_000)  # 6 devices of work
    rest = [ModelDemand(f"m{i}", GIB // 10, 100, 1_000_000) for i in range(40)]  # 0.1 device each
    placement = plan(cells, [hot, *rest])
    assert len(placement["hot"]) == 3  # 6 devices over cells of 4 at half a cell each
    fill = fills(cells, [hot, *rest], placement)
    assert max(fill.values()) <= 1.25 * sum(fill.values()) / len(fill)


def test_models_of_a_cell_that_is_gone_find_another() -> None:
    cells = [CellCapacity(i, 2, 16 * GIB) for i in range(3)]
    demands = [ModelDemand(f"m{i}", GIB // 4, 50.0 * i, 2_000_000) for i in range(30)]
    first = plan(cells, demands)
    second = plan(cells[:2], demands, first)
    assert all(held and set(held) <= {0, 1} for held in second.values())
    kept = [m for m, held in first.items() if 2 not in held]
    assert sum(first[m] == second[m] for m in kept) >= len(kept) - CONFIG.max_moves


@pytest.mark.parametrize(("field", "value"), [("replica_share", 0.0), ("hysteresis", 1.0), ("max_moves", -1)])
def test_bad_settings_are_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        PlacementConfig(**{field: value})  # type: ignore[arg-type]
