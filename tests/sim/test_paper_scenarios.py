"""Fast versions of the paper's scenarios (benchmarks/paper/): every policy keeps the invariants,
and composed workloads report every label."""

from __future__ import annotations

import pytest

from mainspring.models.profile import ModelProfile, builtin_profiles, model_copies
from mainspring.scheduler.registry import policy_names
from mainspring.sim.run import SimulationConfig, SimulationResult, generate_arrivals, simulate
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import (
    AzureTrace,
    ClosedLoop,
    Composition,
    FixedRate,
    Part,
    PoissonOpenLoop,
    ProgressiveActivation,
    SloSweep,
    Workload,
)
from tests.invariants import check_invariants


def copies(model: str, count: int) -> list[ModelProfile]:
    return model_copies([p for p in builtin_profiles() if p.model == model], count)


def run_all(models: list[ModelProfile], workload: Workload, config: SimulationConfig) -> dict[str, SimulationResult]:
    arrivals = generate_arrivals(workload, models, config)
    results = {p: simulate(p, models, workload, config, arrivals) for p in policy_names()}
    for result in results.values():
        check_invariants(result)
    return results


def test_fig5_saturation_keeps_batches_whole() -> None:
    models = copies("resnet50_v2", 8)  # 16 clients each: a round of batches of 16 takes 174 ms, the SLO 100
    config = SimulationConfig(duration_ns=s_to_ns(3), devices=1, slo_ns=ms_to_ns(100), seed=1)
    results = run_all(models, ClosedLoop(128), config)
    limit = 16 / (models[0].exec_ns[16] / 1e9)
    assert results["clockwork"].report.goodput_rps > 0.85 * limit
    assert results["clockwork"].report.goodput_rps > 2 * results["triton"].report.goodput_rps


def test_goodput_holds_past_saturation() -> None:
    """Open loop over 15 models at 1x and 3x the batch-16 limit: the reactive baseline collapses,
    clockwork's goodput grows with the load (bigger batches form) and keeps within 5% of infer4's."""
    models = copies("resnet50_v2", 15)
    limit = 16 / (models[0].exec_ns[16] / 1e9)
    goodput = {}
    for load in (1.0, 3.0):
        config = SimulationConfig(duration_ns=s_to_ns(2), devices=1, seed=1)
        results = run_all(models, PoissonOpenLoop(load * limit), config)
        goodput |= {(load, policy): r.report.goodput_rps / limit for policy, r in results.items()}
    assert goodput[3.0, "clockwork"] > goodput[1.0, "clockwork"] > 0.65
    assert goodput[3.0, "clockwork"] > 0.95 * goodput[3.0, "infer4"]
    assert goodput[3.0, "triton"] < 0.5 * goodput[1.0, "triton"]


def test_fig6_cold_starts_leave_the_minor_model_alone() -> None:
    models = copies("resnet18_v2", 201)
    names = tuple(m.model for m in models)
    workload = Composition(
        [
            Part("minor", FixedRate(200), names[:1]),
            Part("major", ProgressiveActivation(400, initial=20, interval_s=0.05), names[1:]),
        ]
    )
    config = SimulationConfig(duration_ns=s_to_ns(3), devices=1, pool_bytes=40 * 16 * 2**20, seed=1)
    results = run_all(models, workload, config)
    for result in results.values():
        assert set(result.report.by_label) == {"minor", "major"}
    clockwork = results["clockwork"].report
    assert clockwork.evictions > 0  # the majors do not fit: memory churns
    assert clockwork.by_label["minor"]["slo_attainment"] == 1.0


def test_fig7_slo_sweep() -> None:
    models = copies("resnet50_v2", 12)
    workload = SloSweep(PoissonOpenLoop(600), start_factor=1.0, growth=1.5, interval_s=0.2)
    config = SimulationConfig(duration_ns=s_to_ns(2), devices=2, seed=1)
    results = run_all(models, workload, config)
    best_baseline = max(results[p].report.goodput_rps for p in ("triton", "clipper"))
    assert results["clockwork"].report.goodput_rps >= best_baseline


def test_fig8_latency_sensitive_beside_batch_clients() -> None:
    models = copies("resnet50_v2", 10)
    names = tuple(m.model for m in models)
    workload = Composition(
        [
            Part("latency", SloSweep(FixedRate(200), start_factor=5.0, interval_s=0.5), names[:2]),
            Part("batch", ClosedLoop(8, outstanding=4), names[2:], slo_ns=ms_to_ns(1000)),
        ]
    )
    config = SimulationConfig(duration_ns=s_to_ns(2), devices=2, seed=1)
    results = run_all(models, workload, config)
    for result in results.values():
        assert set(result.report.by_label) == {"latency", "batch"}
        assert result.report.by_label["batch"]["requests"] > 100


@pytest.mark.parametrize("ramp_to", [None, 60.0])
def test_fig9_and_fig11_azure(ramp_to: float | None) -> None:
    models = model_copies(builtin_profiles(), 400)
    workload = AzureTrace(scale=20.0, start_minute=360, ramp_to=ramp_to)
    config = SimulationConfig(duration_ns=s_to_ns(3), devices=3, seed=2)
    results = run_all(models, workload, config)
    assert results["clockwork"].report.late == 0
