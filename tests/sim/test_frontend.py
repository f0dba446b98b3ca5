"""The simulated frontend processes in front of the cells: a core each, shedding at arrival with the live
arrival gate."""

from __future__ import annotations

from dataclasses import replace

from mainspring.cells.cost import CLOCKWORK_COST, FREE, FrontendCost
from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.protocol import Outcome
from mainspring.sim.cells import CellsConfig
from mainspring.sim.run import SimulationConfig, SimulationResult, simulate
from mainspring.telemetry.recorder import RequestRow
from mainspring.time import NS_PER_MS, s_to_ns
from mainspring.workload import PoissonOpenLoop
from tests.invariants import check_invariants

MODELS = model_copies(builtin_profiles(), 24)
# 2 ms a call: one frontend core takes 500 calls a second; a refusal costs a twentieth of that.
SLOW_FRONTEND = replace(FREE, frontend=FrontendCost(request_ns=2 * NS_PER_MS, refusal_ns=100_000))


def run(rate: float, cells: CellsConfig) -> SimulationResult:
    config = SimulationConfig(duration_ns=s_to_ns(3), warmup_ns=s_to_ns(1), devices=4, seed=3)
    return simulate("clockwork", MODELS, PoissonOpenLoop(rate), config, cells=cells)


def shed_and_taken(result: SimulationResult) -> tuple[list[RequestRow], list[RequestRow]]:
    rows = result.recorder.requests
    shed = [r for r in rows if r.outcome == Outcome.OVERLOADED.value and "event loop" in r.reason]
    return shed, [r for r in rows if r not in shed]


def test_a_flood_past_the_frontends_core_is_shed_at_arrival_and_what_it_takes_is_served_on_time() -> None:
    result = run(600.0, CellsConfig(1, SLOW_FRONTEND))  # 1.2 times what its core takes
    check_invariants(result)  # every request answered once
    shed, taken = shed_and_taken(result)
    assert len(shed) > 0.1 * len(result.recorder.requests)
    assert sum(r.good for r in taken) >= 0.99 * len(taken)
    assert result.report.goodput_rps >= 0.8 * 500  # it keeps serving what its core can take
    refusals_ms = sorted(r.latency_ns / NS_PER_MS for r in shed)
    assert refusals_ms[int(0.99 * (len(refusals_ms) - 1))] < 50  # refused on reading, not after serving
    assert result.cells is not None
    assert result.cells.frontends[0].shed == len(shed) and result.cells.frontends[0].busy > 0.8


def test_four_times_what_the_frontends_core_takes_is_shed_and_what_it_takes_is_served_on_time() -> None:
    _, taken = shed_and_taken(run(2000.0, CellsConfig(1, SLOW_FRONTEND)))
    counted = [r for r in taken if r.arrival_ns >= s_to_ns(1)]  # past the warm-up: the flood's onset, cold models
    assert sum(r.good for r in counted) >= 0.99 * len(counted)


def test_below_its_capacity_the_frontend_sheds_nothing_and_only_adds_its_time() -> None:
    result = run(200.0, CellsConfig(1, SLOW_FRONTEND))
    assert result.cells is not None and result.cells.frontends[0].shed == 0
    assert result.report.slo_attainment == 1.0
    assert result.report.latency_ms["p50"] >= 2.0  # the call's 2 ms on the frontend's core


def test_frontends_share_the_calls_and_a_free_frontend_is_no_core_at_all() -> None:
    two = run(800.0, CellsConfig(1, SLOW_FRONTEND, frontends=2))
    assert two.cells is not None and [f.calls > 0 for f in two.cells.frontends] == [True, True]
    policy_only = run(800.0, CellsConfig(2, CLOCKWORK_COST))
    without = run(800.0, CellsConfig(2, CLOCKWORK_COST, frontends=0))
    assert policy_only.cells is not None and policy_only.cells.frontends == []
    assert policy_only.recorder.requests == without.recorder.requests
