"""The tight-class guard: batch clients of a loose SLO must not take a tight class down (Fig. 8)."""

from __future__ import annotations

from mainspring.models.profile import ModelProfile, builtin_profiles, model_copies
from mainspring.protocol import DeviceSpec
from mainspring.scheduler.clockwork import ClockworkScheduler
from mainspring.sim.run import SimulationConfig, SimulationResult, generate_arrivals, simulate
from mainspring.time import NS_PER_MS, NS_PER_S, ms_to_ns, s_to_ns
from mainspring.workload import ClosedLoop, Composition, Part, PoissonOpenLoop
from tests.fakes import PAGE, profile, request
from tests.invariants import check_invariants

RESNET50 = next(p for p in builtin_profiles() if p.model == "resnet50_v2")  # b1 3.32 ms, b16 21.73 ms
WARMUP_NS = 1_500 * NS_PER_MS  # the first loads


def planned(slos_ms: dict[str, float]) -> ClockworkScheduler:
    """A policy on two devices that has seen a second of arrivals, 50 a second per model."""
    profiles = {name: profile(name, exec_ms={1: 3.0, 2: 5.0, 4: 8.0, 8: 13.0, 16: 22.0}) for name in slos_ms}
    policy = ClockworkScheduler(profiles, [DeviceSpec(d, "v100", 64 * PAGE, PAGE) for d in range(2)])
    rid = 0
    for step in range(50):
        for name, slo in slos_ms.items():
            rid += 1
            policy.on_request(request(rid, name, step * 20 * NS_PER_MS, slo_ms=slo), step * 20 * NS_PER_MS)
    return policy


def test_one_slo_class_is_not_guarded() -> None:
    for slos in ({"a": 100, "b": 100}, {"a": 10, "b": 15}):  # one SLO; two within a factor of two
        policy = planned(slos)
        assert policy.guard is not None
        assert not policy.guard.plan(NS_PER_S).tight


def test_a_tight_model_beside_a_batch_client_keeps_responsive_devices() -> None:
    policy = planned({"tight": 12, "batch": 86_400_000})
    assert policy.guard is not None
    plan = policy.guard.plan(NS_PER_S)
    assert set(plan.tight) == {"tight"}  # the batch model's 22 ms batch outlasts what it can wait
    slack, wait = plan.tight["tight"]
    assert (slack, wait) == (ms_to_ns(12 - 3), ms_to_ns(12 - 3 - 3))  # room for two batch-1 inferences
    assert len(plan.responsive) == 1  # 50 r/s of 3 ms at half a device: one is enough


def test_a_model_far_from_its_deadline_is_not_tight() -> None:
    policy = planned({"loose": 500, "batch": 86_400_000})  # waits far longer than any batch runs
    assert policy.guard is not None
    assert not policy.guard.plan(NS_PER_S).tight


def fig8_short(clients: int, outstanding: int, guard: bool, tight: bool = True) -> SimulationResult:
    """Fig. 8 as the authors ran it, at its fourth SLO step (3.375 x 3.32 ms), shortened to 4 s."""
    models: list[ModelProfile] = model_copies([RESNET50], 6 + clients)
    names = tuple(m.model for m in models)
    parts = []
    if tight:
        parts.append(Part("latency", PoissonOpenLoop(200), names[:6], slo_ns=round(3.375 * RESNET50.exec_ns[1])))
    if clients:
        parts.append(Part("batch", ClosedLoop(clients, outstanding), names[6:], slo_ns=s_to_ns(86_400)))
    config = SimulationConfig(duration_ns=4 * NS_PER_S - WARMUP_NS, warmup_ns=WARMUP_NS, devices=6, seed=1)
    workload = Composition(parts)
    result = simulate(
        "clockwork",
        models,
        workload,
        config,
        generate_arrivals(workload, models, config),
        settings={"guard_tight": guard},
    )
    check_invariants(result)
    return result


def measured(result: SimulationResult) -> tuple[float, float, float]:
    """After the warm-up: the tight class's attainment, the batch goodput (r/s), the devices' busy share."""
    by_label = result.report.by_label
    tight = by_label.get("latency", {}).get("slo_attainment", 1.0)
    return tight, by_label.get("batch", {}).get("goodput_rps", 0.0), result.report.device_busy


def test_batch_clients_no_longer_take_the_tight_class_down() -> None:
    alone, _, busy = measured(fig8_short(0, 0, guard=True))
    assert alone > 0.999
    unguarded, _, _ = measured(fig8_short(12, 16, guard=False))
    assert unguarded < 0.5  # every device runs 22 ms batches ahead of 3 ms requests due in 11 ms
    for clients, outstanding in ((12, 16), (48, 4)):
        capacity_left = measured(fig8_short(clients, outstanding, guard=True, tight=False))[1] * (1 - busy)
        guarded, batch_rps, _ = measured(fig8_short(clients, outstanding, guard=True))
        assert guarded >= 0.995
        assert batch_rps >= 0.8 * capacity_left  # the devices the tight class does not need run full batches


def test_removing_a_tight_model_while_guarding_plans_on() -> None:
    policy = planned({"tight": 12, "mid": 40, "batch": 86_400_000})
    policy.schedule(NS_PER_S)  # loads, the guard's among them
    policy.remove_model("tight", NS_PER_S)
    policy.schedule(NS_PER_S + NS_PER_MS)  # the plan must not name the removed model
    assert policy.guard is not None
    assert "tight" not in policy.guard.plan(NS_PER_S + NS_PER_MS).tight


def test_a_looser_model_with_nowhere_else_to_run_is_not_starved() -> None:
    """One device, so it is the responsive one; the batch model's batch-1 (6 ms) alone outlasts what
    the tight model can wait (2 ms): it still runs there, in batches of one."""
    models = [
        profile("tight", exec_ms={1: 2.0, 2: 3.0}),
        profile("batch", exec_ms={1: 6.0, 2: 9.0, 4: 14.0, 8: 24.0}),
    ]
    parts = [
        Part("latency", PoissonOpenLoop(50), ("tight",), slo_ns=4 * NS_PER_MS),
        Part("batch", ClosedLoop(1, 8), ("batch",), slo_ns=s_to_ns(86_400)),
    ]
    config = SimulationConfig(duration_ns=2 * NS_PER_S, devices=1, pool_bytes=64 * PAGE, page_bytes=PAGE, seed=3)
    workload = Composition(parts)
    result = simulate("clockwork", models, workload, config, generate_arrivals(workload, models, config))
    check_invariants(result)
    served = [row for row in result.recorder.requests if row.model == "batch" and row.good]
    assert len(served) > 50
