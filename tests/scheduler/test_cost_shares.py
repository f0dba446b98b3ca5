"""Past saturation, a model asking for a steady, modest share keeps it (``share_by_cost``, off by default).

Its demand is weighed at the batch its rate fills, not at batch 1, and a flood of new models shares
one entry of the fair level, however many models it spreads over (``cost_shares.py``).
"""

import random

from mainspring.models.profile import ModelProfile, builtin_profiles, model_copies
from mainspring.protocol import Outcome
from mainspring.scheduler import registry
from mainspring.scheduler.clockwork import ClockworkConfig, ClockworkScheduler
from mainspring.sim.run import SimulationConfig, SimulationResult, generate_arrivals, simulate
from mainspring.time import NS_PER_S
from mainspring.workload import Arrival, ClosedLoop, Composition, FixedRate, Part
from tests.fakes import FixedArrivals
from tests.invariants import check_invariants

RESNET50 = [p for p in builtin_profiles() if p.model == "resnet50_v2"]


def poisson(model: str, rate: float, start_s: float, end_s: float, rng: random.Random) -> list[Arrival]:
    arrivals: list[Arrival] = []
    t = start_s * NS_PER_S
    while True:
        t += rng.expovariate(rate / NS_PER_S)
        if t >= end_s * NS_PER_S:
            return arrivals
        arrivals.append(Arrival(int(t), model))


def run(models: list[ModelProfile], arrivals: list[Arrival], duration_s: float, **settings: object) -> SimulationResult:
    """Clockwork with ``share_by_cost`` on, unless ``settings`` say otherwise."""
    config = ClockworkConfig(**{"share_by_cost": True, **settings})  # type: ignore[arg-type]
    registry._FACTORIES["clockwork-test"] = lambda p, d, rng, m: ClockworkScheduler(p, d, config, rng)
    try:
        sim = SimulationConfig(duration_ns=int(duration_s * NS_PER_S), devices=1, seed=3)
        result = simulate("clockwork-test", models, FixedArrivals(arrivals), sim)
    finally:
        del registry._FACTORIES["clockwork-test"]
    check_invariants(result)
    return result


def attainment(result: SimulationResult, models: set[str], since_s: float) -> float:
    rows = [r for r in result.recorder.requests if r.model in models and r.arrival_ns >= since_s * NS_PER_S]
    return sum(r.good for r in rows) / len(rows)


def test_a_modest_model_beside_a_hot_one_keeps_what_its_batches_cost() -> None:
    # Fig. 6's first major: the minor model at 200 r/s asks 0.66 of the device at batch-1 cost but
    # about a third in the batches its rate fills; the major at 1,000 r/s asks more than the device.
    # Weighed at batch 1 the minor looks over its fair share too, and nobody is protected.
    minor, major = model_copies(RESNET50, 2)
    rng = random.Random(5)
    arrivals = poisson(minor.model, 200, 0, 4, rng) + poisson(major.model, 1000, 1, 4, rng)
    settings = {"share_steady_after_ms": 500.0}  # the minor has asked for long enough when the major comes
    by_cost = run([minor, major], arrivals, 4, **settings)
    at_batch_one = run([minor, major], arrivals, 4, share_by_cost=False, **settings)
    assert attainment(by_cost, {minor.model}, 1.0) >= 0.999
    assert attainment(at_batch_one, {minor.model}, 1.0) < 0.9
    # the major is served with what the minor leaves, and told at once when it asks for more
    rows = [r for r in by_cost.recorder.requests if r.model == major.model]
    assert sum(r.good for r in rows) > 0.3 * len(rows)
    assert sum(r.outcome == Outcome.OVERLOADED.value for r in rows) > 0.2 * len(rows)


def test_a_steady_model_keeps_its_share_beside_a_flood_of_new_models() -> None:
    # A steady model at 100 r/s for 2 s, then 100 new models appear, one every 20 ms, each at 20 r/s:
    # 2,000 r/s that each run alone, three times what the device serves. Each new model asks for a
    # sliver, less than one over their count; the flood as a whole asks for more than the device.
    steady, *flood = model_copies(RESNET50, 101)
    rng = random.Random(6)
    arrivals = poisson(steady.model, 100, 0, 4, rng)
    for i, model in enumerate(flood):
        arrivals += poisson(model.model, 20, 2 + 0.02 * i, 4, rng)
    settings = {"share_steady_after_ms": 1000.0}
    by_cost = run([steady, *flood], arrivals, 4, **settings)
    per_model = run([steady, *flood], arrivals, 4, share_by_cost=False, **settings)
    assert attainment(by_cost, {steady.model}, 2.0) >= 0.98  # a share fitted to its rate: a thin margin
    assert attainment(per_model, {steady.model}, 2.0) < 0.9
    flood_names = {m.model for m in flood}
    rows = [r for r in by_cost.recorder.requests if r.model in flood_names]
    served = sum(r.good for r in rows) / len(rows)
    assert served > 0.1  # the flood has the rest of the device
    assert sum(r.outcome == Outcome.OVERLOADED.value for r in rows) > 0.5 * len(rows)  # and is told at once


def test_models_present_from_the_start_are_shared_max_min() -> None:
    # With no model steady for share_steady_after_ms yet, every model has an entry of its own: two
    # models that start together are shared max-min, the modest one kept whole once their rates are
    # known (the rates are remembered over rate_memory_ms, a second).
    small, hot = model_copies(RESNET50, 2)
    rng = random.Random(7)
    arrivals = poisson(small.model, 100, 0, 3, rng) + poisson(hot.model, 2000, 0, 3, rng)
    assert attainment(run([small, hot], arrivals, 3), {small.model}, 1.0) >= 0.999
    assert attainment(run([small, hot], arrivals, 3, share_by_cost=False), {small.model}, 1.0) < 0.9


def test_the_tight_class_keeps_its_isolation_beside_batch_clients() -> None:
    # Fig. 8 (ours) at its third step: 6 models at 200 r/s each, due in 4.5x their batch-1 time (14.9 ms),
    # beside 12 closed loops of 16 on a one-second SLO, on 6 devices. Weighed at their batches' cost the
    # batch clients ask little and the tight class, in batches of one, is the entry over the level: held,
    # it fell to a fifth. The guard's tight class is an entry of its own, never held.
    models = model_copies(RESNET50, 6 + 12)
    names = tuple(m.model for m in models)
    parts = [
        Part("latency", FixedRate(200), names[:6], slo_ns=round(4.5 * models[0].exec_ns[1])),
        Part("batch", ClosedLoop(12, 16), names[6:], slo_ns=NS_PER_S),
    ]
    warmup_ns = 2 * NS_PER_S  # the first loads, and the rates learnt
    config = SimulationConfig(duration_ns=3 * NS_PER_S, warmup_ns=warmup_ns, devices=6, seed=1)
    workload = Composition(parts)
    result = simulate("clockwork", models, workload, config, generate_arrivals(workload, models, config),
                      settings={"share_by_cost": True})  # fmt: skip
    check_invariants(result)
    assert result.report.by_label["latency"]["slo_attainment"] >= 0.995
    assert result.report.by_label["batch"]["goodput_rps"] > 300  # the batch clients keep the rest


def test_steady_models_near_a_batch_of_two_keep_their_entries() -> None:
    # Three steady models at 23 r/s each: 2.3 requests an SLO, so a rate measured over a second wanders
    # either side of a batch of two. Without hysteresis they fell in and out of the flood and were
    # refused as overloaded at its share; with an entry kept while the rate fills one request an SLO,
    # they keep what they ask for beside 200 new models at 10 r/s each (2,000 r/s, slivers).
    steady, flood = model_copies(RESNET50, 203)[:3], model_copies(RESNET50, 203)[3:]
    rng = random.Random(8)
    arrivals = [a for model in steady for a in poisson(model.model, 23, 0, 6, rng)]
    for i, model in enumerate(flood):
        arrivals += poisson(model.model, 10, 2 + 0.01 * i, 6, rng)
    result = run([*steady, *flood], arrivals, 6, share_steady_after_ms=1000.0)
    # 97.2% measured (84.0% without the hysteresis); where the rest is lost is not diagnosed yet
    assert attainment(result, {m.model for m in steady}, 2.0) >= 0.95
