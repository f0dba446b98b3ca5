"""A burst on one model must not push other models past deadlines they could have met."""

import random

from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import NS_PER_MS, NS_PER_S
from mainspring.workload import Arrival
from tests.fakes import PAGE, FixedArrivals, profile
from tests.invariants import check_invariants

MODELS = [profile("steady"), profile("bursty")]


def burst_workload() -> FixedArrivals:
    rng = random.Random(4)
    arrivals = []
    t = 0.0
    while t < 3 * NS_PER_S:  # the steady model: Poisson, 100 requests/s
        t += rng.expovariate(100 / NS_PER_S)
        arrivals.append(Arrival(int(t), "steady"))
    arrivals.append(Arrival(10 * NS_PER_MS, "bursty"))
    # 3,000 requests in 50 ms on the other model: ten times what the device can serve in time.
    arrivals += [Arrival(NS_PER_S + rng.randrange(50 * NS_PER_MS), "bursty") for _ in range(3000)]
    return FixedArrivals(arrivals)


def attainment(policy: str) -> tuple[float, float, int]:
    config = SimulationConfig(duration_ns=3 * NS_PER_S, devices=1, pool_bytes=64 * PAGE, page_bytes=PAGE, seed=2)
    result = simulate(policy, MODELS, burst_workload(), config)
    check_invariants(result)
    rows = result.recorder.requests
    steady = [r for r in rows if r.model == "steady"]
    bursty = [r for r in rows if r.model == "bursty"]
    rejected_at_once = sum(1 for r in bursty if r.status == "rejected" and r.answered_ns == r.arrival_ns)
    return sum(r.good for r in steady) / len(steady), sum(r.good for r in bursty) / len(bursty), rejected_at_once


def test_clockwork_isolates_a_burst() -> None:
    steady, bursty, rejected_at_once = attainment("clockwork")
    assert steady == 1.0
    assert 0.02 < bursty < 0.5  # the burst is served as far as capacity allows...
    assert rejected_at_once > 2000  # ...and the excess is told so at once


def test_a_reactive_baseline_does_not() -> None:
    steady, _, _ = attainment("triton")
    assert steady < 0.9  # the burst's queue delays the steady model past its deadlines
