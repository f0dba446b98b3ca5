"""Simulated cells: each cell's controller core on the clock, requests routed between cells, every
request answered once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mainspring.cells.cost import FREE, ControllerCost
from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.protocol import DeviceSpec, Outcome, ResponseStatus
from mainspring.sim.cells import CellsConfig, split_devices
from mainspring.sim.run import SimulationConfig, SimulationResult, simulate
from mainspring.time import NS_PER_MS, NS_PER_S, s_to_ns
from mainspring.workload import ClosedLoop, PoissonOpenLoop, Workload
from tests.invariants import check_invariants

MODELS = model_copies(builtin_profiles(), 24)


def run(
    workload: Workload, cells: CellsConfig | None, devices: int = 4, seconds: float = 2.0, seed: int = 1
) -> SimulationResult:
    config = SimulationConfig(duration_ns=s_to_ns(seconds), devices=devices, seed=seed)
    return simulate("clockwork", MODELS, workload, config, cells=cells)


def test_devices_split_into_runs_at_most_one_apart() -> None:
    specs = [DeviceSpec(i, "v100", 1 << 30, 1 << 24) for i in range(10)]
    groups = split_devices(specs, 3)
    assert [len(g) for g in groups] == [4, 3, 3]
    assert [s.device for g in groups for s in g] == list(range(10))
    with pytest.raises(ValueError, match="each cell needs a device"):
        split_devices(specs, 11)


def test_one_cell_whose_controller_costs_nothing_serves_as_one_controller_does() -> None:
    workload = PoissonOpenLoop(800.0, "zipf")
    plain = run(workload, None)
    one = run(workload, CellsConfig(1, FREE))
    rows = sorted((r.request_id, r.answered_ns, r.status, r.action_id) for r in plain.recorder.requests)
    assert sorted((r.request_id, r.answered_ns, r.status, r.action_id) for r in one.recorder.requests) == rows
    assert one.cells is not None and one.cells.cells[0].busy == 0


@pytest.mark.parametrize("retry", [False, True])
@pytest.mark.parametrize("workload", [PoissonOpenLoop(1500.0, "zipf"), ClosedLoop(16, 1)])
def test_every_request_is_answered_once_over_three_cells(workload: Workload, retry: bool) -> None:
    result = run(workload, CellsConfig(3, retry_rejected=retry), devices=5)
    check_invariants(result)
    assert result.cells is not None
    assert [c.devices for c in result.cells.cells] == [2, 2, 1]
    assert sum(c.requests for c in result.cells.cells) >= result.recorder.received
    assert all(0 <= c.busy < 1 for c in result.cells.cells)
    assert result.report.slo_attainment > 0.99


def test_the_controllers_time_is_on_the_clock() -> None:
    """A controller that takes 3 ms per request answers no sooner than that after each arrival."""
    slow = ControllerCost(3 * NS_PER_MS, 0, 0, 0, 0, 0)
    free = run(PoissonOpenLoop(50.0), CellsConfig(1, FREE), devices=1)
    costed = run(PoissonOpenLoop(50.0), CellsConfig(1, slow), devices=1)
    served = [r for r in costed.recorder.requests if r.status == ResponseStatus.SUCCESS.value]
    assert served and all(r.latency_ns >= 3 * NS_PER_MS for r in served)
    assert costed.report.latency_ms["p50"] >= free.report.latency_ms["p50"] + 2.9
    assert costed.cells is not None and costed.cells.cells[0].cost_us_per_request == pytest.approx(3000, rel=0.01)


def test_an_overloaded_controller_plans_late_and_cells_share_the_load() -> None:
    """Twenty times the calibrated cost: one controller core cannot keep up with 4 devices' load (its
    plans reach the devices after their windows, or its requests are refused as overloaded); four
    cells, one core each, can."""
    from mainspring.cells.cost import CLOCKWORK_COST

    policy_terms = ("request_ns", "result_ns", "pass_ns", "pass_per_device_ns", "action_ns", "answer_ns")
    heavy = ControllerCost(*(20 * getattr(CLOCKWORK_COST, f) for f in policy_terms))
    workload = PoissonOpenLoop(1200.0)
    one = run(workload, CellsConfig(1, heavy), seconds=3.0)
    four = run(workload, CellsConfig(4, heavy), seconds=3.0)
    assert one.cells is not None and one.cells.cells[0].busy > 0.95
    check_invariants(one)
    check_invariants(four)
    assert one.report.slo_attainment < 0.9
    assert one.report.refused_actions > 0 or (one.cells is not None and one.cells.cells[0].refused > 0)
    assert four.report.slo_attainment > 0.98


def test_a_guarded_controller_refuses_at_once_when_far_behind() -> None:
    stalled = ControllerCost(40 * NS_PER_MS, 0, 0, 0, 0, 0)  # 25 requests a second at most
    result = run(PoissonOpenLoop(400.0), CellsConfig(1, stalled, max_lag_ns=20 * NS_PER_MS), devices=1)
    check_invariants(result)
    overloaded = [r for r in result.recorder.requests if r.outcome == Outcome.OVERLOADED.value]
    assert result.cells is not None and result.cells.cells[0].refused == len(overloaded) > 0
    assert all("ms behind (max_loop_lag_ms)" in r.reason for r in overloaded)
    assert all(r.answered_ns == r.arrival_ns for r in overloaded)  # refused before the policy


def test_requests_still_waiting_for_a_core_when_the_run_ends_are_answered() -> None:
    """A controller far behind when the run stops (no drain, no load limits): every request routed to a
    cell is answered once, those it never took in as shutting down."""
    stalled = ControllerCost(40 * NS_PER_MS, 0, 0, 0, 0, 0)
    config = SimulationConfig(duration_ns=s_to_ns(1), devices=2, seed=4, drain_ns=0)
    cells = CellsConfig(2, stalled, max_lag_ns=10 * NS_PER_S, retry_rejected=True)
    result = simulate("clockwork", MODELS, PoissonOpenLoop(300.0), config, cells=cells)
    check_invariants(result)
    assert result.cells is not None
    assert len(result.recorder.requests) == sum(c.requests for c in result.cells.cells) - result.cells.second_tries
    shut = [r for r in result.recorder.requests if r.outcome == Outcome.SHUTTING_DOWN.value]
    assert len(shut) > 100  # most never reached a policy


def test_a_hot_model_is_replicated_and_routed_by_signal() -> None:
    """One model with the load of two devices, over cells of two: the planner gives it more cells and
    the router spreads it by their signals; it is served as well as by one controller over all six."""
    hot = replace(MODELS[0], model="hot")
    models = [hot, *MODELS[1:]]
    config = SimulationConfig(duration_ns=s_to_ns(3), devices=6, seed=2)
    rate = 2 * NS_PER_S / min(ns / b for b, ns in hot.exec_ns.items())  # two devices' worth
    from mainspring.workload.compose import Composition, Part

    rest = tuple(m.model for m in MODELS[1:])
    workload = Composition([Part("hot", PoissonOpenLoop(rate), ("hot",)), Part("rest", PoissonOpenLoop(300.0), rest)])
    result = simulate("clockwork", models, workload, config, cells=CellsConfig(3))
    one = simulate("clockwork", models, workload, config)
    check_invariants(result)
    assert result.cells is not None and result.cells.replicated >= 1 and result.cells.routed_by_signal > 1000
    assert result.report.by_label["hot"]["slo_attainment"] >= one.report.by_label["hot"]["slo_attainment"] - 0.01


def test_bad_cells_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="cells must be at least 1"):
        CellsConfig(0)
    with pytest.raises(ValueError, match="signal_period_ns"):
        CellsConfig(2, signal_period_ns=0)
    with pytest.raises(ValueError, match="controller cost coefficients must not be negative: request_ns"):
        ControllerCost(-1, 0, 0, 0, 0, 0)
