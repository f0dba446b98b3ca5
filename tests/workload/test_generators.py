import itertools
import random
from collections import Counter

import pytest

from mainspring.models.profile import ModelProfile
from mainspring.time import NS_PER_MS, NS_PER_S, ms_to_ns
from mainspring.workload import Arrival, BurstyOnOff, ClosedLoop, PoissonOpenLoop, SloSweep
from mainspring.workload.generators import popularity_weights
from tests.fakes import profile

MODELS: list[ModelProfile] = [profile(f"m{i}") for i in range(10)]


def test_poisson_rate_and_uniform_popularity() -> None:
    arrivals = list(PoissonOpenLoop(500).arrivals(MODELS, 20 * NS_PER_S, random.Random(1)))
    assert 9_500 < len(arrivals) < 10_500
    assert [a.time_ns for a in arrivals] == sorted(a.time_ns for a in arrivals)
    counts = Counter(a.model for a in arrivals)
    assert len(counts) == 10 and max(counts.values()) < 1.15 * min(counts.values())


def test_zipf_popularity_is_skewed() -> None:
    arrivals = list(PoissonOpenLoop(500, "zipf").arrivals(MODELS, 20 * NS_PER_S, random.Random(1)))
    counts = Counter(a.model for a in arrivals)
    assert counts["m0"] > 1.7 * counts["m1"] > 1.7 * 1.2 * counts["m3"]
    assert popularity_weights(3, "zipf", 2.0) == [1.0, 0.25, 1 / 9]
    with pytest.raises(ValueError, match="unknown popularity"):
        PoissonOpenLoop(1, "pareto")


def test_same_seed_same_arrivals() -> None:
    workload = BurstyOnOff(50)
    first = list(workload.arrivals(MODELS, 10 * NS_PER_S, random.Random(9)))
    assert first == list(workload.arrivals(MODELS, 10 * NS_PER_S, random.Random(9)))
    assert first != list(workload.arrivals(MODELS, 10 * NS_PER_S, random.Random(10)))


def test_bursty_alternates_on_and_off() -> None:
    arrivals = list(BurstyOnOff(200, mean_on_s=1, mean_off_s=4).arrivals(MODELS[:1], 200 * NS_PER_S, random.Random(2)))
    # Long on average one fifth of the time at 200 r/s: about 8,000 arrivals.
    assert 5_000 < len(arrivals) < 11_000
    gaps = [b.time_ns - a.time_ns for a, b in itertools.pairwise(arrivals)]
    assert sum(g > NS_PER_S for g in gaps) > 10  # off phases show as long silences


def test_closed_loop_keeps_n_outstanding_and_stops_at_the_end() -> None:
    workload = ClosedLoop(clients=3, outstanding=2)
    initial = list(workload.arrivals(MODELS, 10 * NS_PER_S, random.Random(1)))
    assert len(initial) == 6 and {a.model for a in initial} == {"m0", "m1", "m2"}
    assert workload.on_answer(initial[0], 5 * NS_PER_S, True) == Arrival(5 * NS_PER_S, "m0")
    assert workload.on_answer(initial[0], 5 * NS_PER_S, False) == Arrival(5 * NS_PER_S + 10 * NS_PER_MS, "m0")
    assert workload.on_answer(initial[0], 10 * NS_PER_S, True) is None


def test_slo_sweep_grows_by_a_factor_every_interval() -> None:
    sweep = SloSweep(PoissonOpenLoop(100), start_factor=1.0, growth=2.0, interval_s=1.0, max_factor=8.0)
    arrivals = list(sweep.arrivals(MODELS, 6 * NS_PER_S, random.Random(1)))
    b1 = ms_to_ns(2.0)
    for a in arrivals:
        step = a.time_ns // NS_PER_S
        assert a.slo_ns == min(8, 2**step) * b1
    with pytest.raises(ValueError, match="growth"):
        SloSweep(PoissonOpenLoop(1), growth=0.5)


def test_slo_sweep_in_a_unit_of_its_own_gives_every_model_the_same_slo() -> None:
    """The authors' SLO unit (2.9 ms for resnet50_v2 in their README), whatever the profiles say."""
    sweep = SloSweep(PoissonOpenLoop(100), start_factor=1.0, growth=1.5, interval_s=1.0, unit_ms=2.9)
    arrivals = list(sweep.arrivals(MODELS, 3 * NS_PER_S, random.Random(1)))
    assert {a.slo_ns for a in arrivals if a.time_ns < NS_PER_S} == {ms_to_ns(2.9)}
    assert {a.slo_ns for a in arrivals if a.time_ns >= 2 * NS_PER_S} == {ms_to_ns(2.9 * 2.25)}
    with pytest.raises(ValueError, match="unit_ms"):
        SloSweep(PoissonOpenLoop(1), unit_ms=0)
