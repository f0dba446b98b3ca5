"""Invariants over random small workloads, for every policy (hypothesis)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mainspring.scheduler.registry import policy_names
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import NS_PER_MS, NS_PER_S
from mainspring.workload import BurstyOnOff, ClosedLoop, PoissonOpenLoop, SloSweep, Workload
from tests.fakes import PAGE, profile
from tests.invariants import check_invariants

workloads = st.one_of(
    st.builds(PoissonOpenLoop, st.floats(5, 3000), st.sampled_from(["uniform", "zipf"])),
    st.builds(BurstyOnOff, st.floats(5, 500), st.floats(0.05, 0.5), st.floats(0.05, 0.5)),
    st.builds(ClosedLoop, st.integers(1, 12), st.integers(1, 3)),
    st.builds(
        SloSweep, st.builds(PoissonOpenLoop, st.floats(50, 1000)), st.just(1.0), st.floats(1, 3), st.floats(0.05, 0.3)
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(policy_names()),
    workload=workloads,
    n_models=st.integers(1, 8),
    devices=st.integers(1, 3),
    pool_pages=st.integers(6, 24),
    slo_ms=st.floats(2, 200),
    duration_ms=st.integers(50, 1500),
    seed=st.integers(0, 2**16),
)
def test_every_policy_keeps_the_invariants(
    policy: str,
    workload: Workload,
    n_models: int,
    devices: int,
    pool_pages: int,
    slo_ms: float,
    duration_ms: int,
    seed: int,
) -> None:
    models = [profile(f"m{i}", pages=2 + i % 4, load_ms=2 + i) for i in range(n_models)]
    config = SimulationConfig(
        duration_ns=duration_ms * NS_PER_MS,
        devices=devices,
        pool_bytes=pool_pages * PAGE,
        page_bytes=PAGE,
        slo_ns=round(slo_ms * NS_PER_MS),
        seed=seed,
        drain_ns=2 * NS_PER_S,
    )
    result = simulate(policy, models, workload, config)
    check_invariants(result)
