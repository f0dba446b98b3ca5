"""Composed workloads: fixed rates, progressive activation, labelled parts, load ramps."""

import random
from collections import Counter

import pytest

from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import NS_PER_MS, NS_PER_S
from mainspring.workload import (
    AzureTrace,
    ClosedLoop,
    Composition,
    FixedRate,
    Part,
    ProgressiveActivation,
    SloSweep,
)
from tests.fakes import PAGE, profile
from tests.invariants import check_invariants

MODELS = [profile(f"m{i}") for i in range(6)]


def test_fixed_rate_spaces_every_model_evenly() -> None:
    arrivals = list(FixedRate(200).arrivals(MODELS[:2], 2 * NS_PER_S, random.Random(3)))
    assert Counter(a.model for a in arrivals) == {"m0": 400, "m1": 400}
    gaps = {b.time_ns - a.time_ns for a, b in zip(arrivals[::2], arrivals[2::2], strict=False) if a.model == b.model}
    assert gaps and all(abs(g - 5 * NS_PER_MS) <= 1 for g in gaps)


def test_progressive_activation_adds_one_model_per_interval() -> None:
    workload = ProgressiveActivation(1000, initial=1, interval_s=1.0)
    arrivals = list(workload.arrivals(MODELS, 4 * NS_PER_S, random.Random(2)))
    first_seen = {}
    for a in arrivals:
        first_seen.setdefault(a.model, a.time_ns)
    assert sorted(first_seen) == ["m0", "m1", "m2", "m3"]  # four seconds: four models active
    assert all(first_seen[f"m{i}"] >= i * NS_PER_S for i in range(4))


def test_progressive_activation_waits_for_its_start() -> None:
    workload = ProgressiveActivation(1000, initial=1, interval_s=1.0, start_s=2.0)
    arrivals = list(workload.arrivals(MODELS, 4 * NS_PER_S, random.Random(2)))
    assert arrivals and min(a.time_ns for a in arrivals) >= 2 * NS_PER_S  # nothing in the lead-in
    assert {a.model for a in arrivals} == {"m0", "m1"}  # two seconds of activation: two models
    assert 1500 < len(arrivals) < 2500  # the rate holds from the start on
    with pytest.raises(ValueError, match="start_s >= 0"):
        ProgressiveActivation(1000, start_s=-1)


def test_a_composition_labels_its_parts_and_the_report_breaks_attainment_down() -> None:
    workload = Composition(
        [
            Part("latency", FixedRate(100), ("m0", "m1"), slo_ns=20 * NS_PER_MS),
            Part("batch", ClosedLoop(4, outstanding=2), ("m2",), slo_ns=500 * NS_PER_MS),
        ]
    )
    config = SimulationConfig(duration_ns=NS_PER_S, devices=1, pool_bytes=64 * PAGE, page_bytes=PAGE, seed=1)
    result = simulate("clockwork", MODELS, workload, config)
    check_invariants(result)
    by_label = result.report.by_label
    assert set(by_label) == {"latency", "batch"}
    assert 190 <= by_label["latency"]["requests"] <= 202
    assert by_label["batch"]["requests"] > 100  # the closed loop kept going, its follow-ups labelled too
    deadlines = {r.request_id: r.deadline_ns - r.arrival_ns for r in result.recorder.requests}
    assert {deadlines[i] for i, label in result.labels.items() if label == "batch"} == {500 * NS_PER_MS}
    with pytest.raises(ValueError, match="distinct"):
        Composition([Part("x", FixedRate(1), ("m0",)), Part("x", FixedRate(1), ("m1",))])


def test_an_slo_sweep_over_a_closed_loop_gives_follow_ups_the_current_slo() -> None:
    sweep = SloSweep(ClosedLoop(1), start_factor=2.0, growth=2.0, interval_s=0.5)
    (first,) = list(sweep.arrivals(MODELS[:1], NS_PER_S, random.Random(1)))
    follow = sweep.on_answer(first, 600 * NS_PER_MS, True)
    assert follow is not None and follow.slo_ns == MODELS[0].slo_ns_for_factor(4.0)


def test_an_azure_ramp_grows_the_load() -> None:
    ramp = AzureTrace(scale=10.0, ramp_to=90.0)
    assert ramp.scale_at(0, 60 * NS_PER_S) == 10.0 and ramp.scale_at(30 * NS_PER_S, 60 * NS_PER_S) == 50.0
    assert "x10..x90" in ramp.describe()
    arrivals = list(ramp.arrivals(MODELS, 60 * NS_PER_S, random.Random(1)))
    first, last = (sum(1 for a in arrivals if lo <= a.time_ns < lo + 10 * NS_PER_S) for lo in (0, 50 * NS_PER_S))
    assert 4.5 * first < last < 5.5 * first  # the scales over the two windows average 16.7 and 83.3


def test_a_network_delay_is_planned_for_so_no_success_is_late() -> None:
    """With 2 ms each way, a batch planned to end at the deadline would be answered 2 ms late."""
    workload = FixedRate(150)
    config = SimulationConfig(
        duration_ns=2 * NS_PER_S,
        devices=1,
        pool_bytes=64 * PAGE,
        page_bytes=PAGE,
        slo_ns=12 * NS_PER_MS,
        network_latency_ns=2 * NS_PER_MS,
        seed=3,
    )
    result = simulate("clockwork", MODELS[:3], workload, config)
    check_invariants(result)
    assert result.report.succeeded > 500
    assert result.report.late == 0
