"""The cells planner: its re-plan schedule, the demand it plans from, handovers, and each request's cell."""

from __future__ import annotations

from mainspring.cells.placement import CellCapacity
from mainspring.cells.planner import CellsPlanner, Handover, capacity_of_specs
from mainspring.cells.routing import CellSignal, Costs
from mainspring.protocol import DeviceSpec
from mainspring.time import NS_PER_MS, NS_PER_S
from tests.fakes import profile

CELLS = [CellCapacity(i, 2, 2 * 2**30) for i in range(3)]
MODELS = {name: profile(name) for name in ("hot", "b", "c", "d")}
COSTS = Costs(2 * NS_PER_MS, NS_PER_MS, 5 * NS_PER_MS)
ALL = (0, 1, 2)


def test_re_plans_come_at_the_start_a_quarter_second_on_then_twice_as_far_apart_up_to_two_seconds() -> None:
    planner = CellsPlanner(start_ns=0)
    times = []
    for _ in range(6):
        times.append(planner.next_replan_ns)
        planner.replan(planner.next_replan_ns, CELLS, MODELS)
    assert times == [0, NS_PER_S // 4, 3 * NS_PER_S // 4, 7 * NS_PER_S // 4, 15 * NS_PER_S // 4, 23 * NS_PER_S // 4]


def test_a_rate_is_the_arrivals_over_the_time_measured_then_halfway_to_the_last() -> None:
    planner = CellsPlanner()
    planner.replan(0, CELLS, MODELS)
    planner.arrived("b", 100)
    first = planner.replan(NS_PER_S // 2, CELLS, MODELS)  # a late re-plan: half a second measured, not 0.25
    assert first is not None and first.rates["b"] == 200.0 and first.rates["c"] == 0.0
    second = planner.replan(NS_PER_S, CELLS, MODELS)
    assert second is not None and second.rates["b"] == 100.0  # no arrivals: halfway to 0


def test_no_model_or_no_cell_plans_nothing_but_the_schedule_moves_on() -> None:
    planner = CellsPlanner()
    assert planner.replan(0, CELLS, {}) is None and planner.replan(planner.next_replan_ns, [], MODELS) is None
    assert planner.next_replan_ns == 3 * NS_PER_S // 4 and planner.placement == {}


def hot_planner() -> tuple[CellsPlanner, int]:
    """``hot`` gains a second cell at the re-plan at 0.25 s (1,500 r/s: 1.7 devices busy, past the
    replica threshold of half a cell's two devices, with its band)."""
    planner = CellsPlanner()
    planner.replan(0, CELLS, MODELS)
    assert all(len(cells) == 1 for cells in planner.placement.values())
    planner.arrived("hot", 375)
    return planner, planner.next_replan_ns


def test_a_model_that_gains_a_cell_is_handed_over_and_warmed_there_until_exactly_its_end() -> None:
    planner, at = hot_planner()
    (old,) = planner.placement["hot"]
    replan = planner.replan(at, CELLS, MODELS)
    assert replan is not None and replan.changed == ("hot",)
    new = replan.placement["hot"]
    (gained,) = set(new) - {old}
    assert old in new and replan.warms == ((gained, "hot"),)
    assert replan.handovers == {"hot": Handover(at + NS_PER_S, new)}  # old and new: the same two here
    assert planner.candidates("hot", at + NS_PER_S - 1, ALL, ALL) == new
    assert planner.candidates("hot", at + NS_PER_S, ALL, ALL) == new


def test_a_moved_model_is_served_by_its_old_cell_until_the_handover_ends() -> None:
    planner = CellsPlanner()
    planner.replan(0, CELLS, MODELS)
    crowded = next(cell for cell in ALL if sum(cells == (cell,) for cells in planner.placement.values()) >= 2)
    for name, cells in planner.placement.items():
        if cells == (crowded,):
            planner.arrived(name, 150)  # 600 r/s each: one cell holds both, the others idle
    before = dict(planner.placement)
    replan = planner.replan(planner.next_replan_ns, CELLS, MODELS)
    assert replan is not None and len(replan.changed) == 1
    (moved,) = replan.changed
    handover = replan.handovers[moved]
    assert handover.cells == tuple(sorted({crowded, *replan.placement[moved]}))
    assert replan.warms == ((replan.placement[moved][0], moved),)
    assert planner.candidates(moved, handover.until_ns - 1, ALL, ALL) == handover.cells
    assert planner.candidates(moved, handover.until_ns, ALL, ALL) == replan.placement[moved]  # ends at until_ns
    assert before[moved] == (crowded,)


def test_a_dropped_replica_is_not_handed_over() -> None:
    planner, at = hot_planner()
    planner.replan(at, CELLS, MODELS)
    at = planner.next_replan_ns
    for _ in range(4):  # no more arrivals: the rate halves until the replica goes
        replan = planner.replan(at, CELLS, MODELS)
        at = planner.next_replan_ns
        assert replan is not None
        if replan.changed:
            break
    assert replan.changed == ("hot",) and len(replan.placement["hot"]) == 1
    assert replan.handovers == {} and replan.warms == ()
    assert planner.candidates("hot", replan.at_ns, ALL, ALL) == replan.placement["hot"]


def test_a_request_goes_to_its_planned_cells_that_are_able_else_any_able_else_any_serving_else_none() -> None:
    planner = CellsPlanner()
    planner.replan(0, CELLS, MODELS)
    (home,) = planner.placement["b"]
    others = tuple(c for c in ALL if c != home)
    assert planner.candidates("b", 0, ALL, ALL) == (home,)
    assert planner.candidates("b", 0, others, ALL) == others  # its cell is silent or restarting
    assert planner.candidates("b", 0, (), (2, 0)) == (0, 2)  # none live: the serving ones, silent too
    assert planner.candidates("unknown", 0, (1,), ALL) == (1,)  # no plan: any able cell
    assert planner.candidates("b", 0, (), ()) == ()
    assert planner.route("b", 0, (), (), COSTS) is None
    first = planner.replan(planner.next_replan_ns, CELLS, MODELS)
    assert first is not None and first.rates["b"] == 0.0  # a request with no cell is not counted


def test_a_second_try_goes_to_another_cell_in_the_routers_order() -> None:
    planner = CellsPlanner()
    for cell, finish_ms in ((0, 30), (1, 20), (2, 10)):
        planner.router.publish(CellSignal(cell, 0, 1, {"m": finish_ms * NS_PER_MS}, 0))
    assert planner.route("m", 0, ALL, ALL, COSTS) == 2
    assert planner.retry("m", 2, 0, 0, ALL, ALL, COSTS, meet_deadline=False) == 1  # never ran: no deadline test
    assert planner.retry("m", 2, 0, 15 * NS_PER_MS, ALL, ALL, COSTS, meet_deadline=True) is None  # none makes it
    assert planner.retry("m", 0, 0, 0, (0,), (0,), COSTS, meet_deadline=False) is None


def test_a_cells_capacity_is_its_devices_pools_together() -> None:
    specs = [DeviceSpec(0, "v100", 2**30), DeviceSpec(1, "v100", 2**30 + 5)]  # a partial page does not count
    assert capacity_of_specs(3, specs) == CellCapacity(3, 2, 2 * 2**30)
