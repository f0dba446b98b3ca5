import math
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from mainspring.scheduler.estimator import DecayingRate, Estimator, RollingPercentile
from tests.fakes import profile

PROFILES = {"a": profile("a"), "b": profile("b")}  # batch 1: 2 ms; load 5 ms


def test_p99_of_the_last_ten_measurements() -> None:
    window = RollingPercentile(0, 10, 99.0)
    for value in [5, 1, 9, 3]:
        window.add(value)
    assert window.value == 9 and not window.full
    for value in range(10, 20):
        window.add(value)
    assert window.full and window.value == 19  # 9 fell out of the window
    median = RollingPercentile(0, 10, 50.0)
    for value in range(1, 11):
        median.add(value)
    assert median.value == 5


def test_seeded_from_the_profile_then_learns_per_model() -> None:
    estimator = Estimator(PROFILES)
    assert estimator.exec_ns("a", 1, "v100") == 2_000_000
    assert estimator.load_ns("a", "v100") == 5_000_000
    for _ in range(10):
        estimator.observe_exec("a", 1, "v100", 2_500_000, at_ns=0)
    assert estimator.exec_ns("a", 1, "v100") == 2_500_000
    assert estimator.exec_ns("a", 1, "other-kind") == 2_000_000


def test_a_kind_with_its_own_percentile_discounts_one_spike() -> None:
    """A CPU worker's one interference spike in ten runs sets a GPU kind's p99 (the largest of ten),
    not the CPU kind's p90 (the second largest); loads and the kind's borrowed ratio follow the same rule."""
    estimator = Estimator(PROFILES, kind_percentiles={"cpu": 90.0})
    runs = [2_000_000] * 8 + [2_400_000, 9_000_000]  # one stall among ten
    for kind in ("cpu", "v100"):
        for measured in runs:
            estimator.observe_exec("a", 1, kind, measured, at_ns=0)
            estimator.observe_load("a", kind, measured * 5 // 2, at_ns=0)
    assert estimator.exec_ns("a", 1, "cpu") == 2_400_000 and estimator.exec_ns("a", 1, "v100") == 9_000_000
    assert estimator.load_ns("a", "cpu") == 6_000_000 and estimator.load_ns("a", "v100") == 22_500_000
    # "b" never ran: its profile (2 ms) times the kind's ratio of measured to profiled, at the kind's percentile
    assert estimator.exec_ns("b", 1, "cpu") == 2_400_000 and estimator.exec_ns("b", 1, "v100") == 9_000_000


def cpu_estimator(**ages: int) -> Estimator:
    """A CPU kind at p90 whose borrowed ratio is 1.0: ``b`` ran 100 times at its profile."""
    estimator = Estimator(PROFILES, kind_percentiles={"cpu": 90.0}, **ages)
    for _ in range(100):
        estimator.observe_exec("b", 1, "cpu", 2_000_000, at_ns=0)
    return estimator


def test_one_stall_in_a_window_not_yet_full_is_not_its_estimate_at_p90() -> None:
    """A partial window supports what a full one would: at p90 of ten, one stall is outvoted, two
    stand; at p99 (a GPU kind) the largest value stands either way."""
    estimator = cpu_estimator()
    estimator.observe_exec("a", 1, "cpu", 2_100_000, at_ns=0)
    estimator.observe_exec("a", 1, "cpu", 7_000_000, at_ns=0)  # a stall
    assert estimator.exec_ns("a", 1, "cpu") == 2_100_000  # at least the profile times the ratio (2 ms)
    assert estimator.exec_table("a", (1,), "cpu") == [2_100_000]
    estimator.observe_exec("a", 1, "cpu", 6_000_000, at_ns=0)  # a second: the second largest of three
    assert estimator.exec_ns("a", 1, "cpu") == 6_000_000 == estimator.exec_table("a", (1,), "cpu")[0]
    gpu = Estimator(PROFILES)
    gpu.observe_exec("a", 1, "v100", 7_000_000, at_ns=0)
    assert gpu.exec_ns("a", 1, "v100") == 7_000_000


def test_a_stall_not_measured_away_is_forgotten_after_the_suspect_age() -> None:
    """A size whose window says twice its profile (times the kind's ratio) is rarely planned, so it
    is not measured again: unmeasured for ``suspect_age_ns`` its window is forgotten. One measured
    since, or one within 1.5x of the profile, is kept."""
    estimator = cpu_estimator(suspect_age_ns=1_000)
    for at_ns, measured in [(0, 7_000_000), (0, 6_000_000), (0, 2_000_000)]:
        estimator.observe_exec("a", 1, "cpu", measured, at_ns)
        estimator.observe_exec("a", 2, "cpu", measured, at_ns)
        estimator.observe_exec("b", 2, "cpu", measured // 3 + 1_000_000, at_ns)  # 1.33-3.33 ms: within 1.5x
    estimator.observe_exec("a", 2, "cpu", 6_500_000, at_ns=800)  # measured since
    changed: list[tuple[str, str | None]] = []
    estimator.watch(lambda kind, model: changed.append((kind, model)))
    estimator.expire(999)
    assert estimator.exec_ns("a", 1, "cpu") == 6_000_000 and not changed
    estimator.expire(1_001)
    assert estimator.exec_ns("a", 1, "cpu") == 2_000_000  # forgotten: the profile times the ratio
    assert changed == [("cpu", "a")]
    assert estimator.exec_ns("a", 2, "cpu") == 6_500_000
    assert estimator.exec_ns("b", 2, "cpu") == 3_000_000
    estimator.expire(1_801)
    assert estimator.exec_ns("a", 2, "cpu") == 3_000_000  # 800 ns later its last measurement ages out too


def test_an_estimator_fed_by_another_sees_every_measurement_at_its_own_percentile() -> None:
    """Admission's estimator (``admission_percentile_cpu``) learns what the planner's learns."""
    planner = Estimator(PROFILES, kind_percentiles={"cpu": 90.0})
    judge = Estimator(PROFILES, kind_percentiles={"cpu": 50.0})
    planner.feed(judge)
    for measured in [2_200_000] * 8 + [2_400_000, 9_000_000]:
        planner.observe_exec("a", 1, "cpu", measured, at_ns=0)
        planner.observe_load("a", "cpu", measured * 5 // 2, at_ns=0)
    assert planner.exec_ns("a", 1, "cpu") == 2_400_000 and judge.exec_ns("a", 1, "cpu") == 2_200_000
    assert judge.load_ns("a", "cpu") == 5_500_000
    planner.restart_exec("a", 1, "cpu", 3_000_000, at_ns=0)  # a probe's measurement replaces the window
    assert judge.exec_ns("a", 1, "cpu") == 3_000_000
    planner.forget("a")
    assert judge.exec_ns("a", 1, "cpu") == 2_200_000  # the window is gone: the profile times the median ratio


def test_rarely_run_models_borrow_the_device_kinds_ratio() -> None:
    estimator = Estimator(PROFILES)
    for _ in range(10):
        estimator.observe_load("a", "v100", 5_500_000, at_ns=0)  # loads run 10% over the profile
    assert estimator.load_ns("b", "v100") == 5_500_000  # never measured: profile x p99 ratio
    estimator.observe_load("b", "v100", 5_200_000, at_ns=0)
    assert estimator.load_ns("b", "v100") == 5_500_000  # one sample: not yet trusted alone


def test_decaying_rate_remembers_recent_work() -> None:
    rate = DecayingRate(tau_ns=1_000)
    rate.add(500, now_ns=0)
    assert rate.value(0) == 0.5
    assert 0.18 < rate.value(1_000) < 0.19  # e^-1 of it a tau later


def test_a_window_no_longer_measured_is_forgotten() -> None:
    estimator = Estimator(PROFILES, max_age_ns=1_000)
    for at in range(0, 1_000, 100):  # batch 2 keeps running; batch 1 ran once, in a stall
        estimator.observe_exec("a", 2, "v100", 3_100_000, at_ns=at)
        if at == 500:
            estimator.observe_exec("a", 1, "v100", 900_000_000, at_ns=at)
    estimator.expire(1_050)
    assert estimator.exec_ns("a", 1, "v100") == 900_000_000  # measured 550 ns ago: still believed
    estimator.expire(1_600)
    # Batch 1 starts again from its profile, times the kind's ratio (which has let the stall go too).
    assert estimator.exec_ns("a", 1, "v100") == 2_000_000 * 31 // 30
    assert estimator.exec_ns("a", 2, "v100") == 3_100_000  # measured within the age: its window is kept
    estimator.expire(2_000)
    assert estimator.exec_ns("a", 2, "v100") == 3_000_000  # nothing measured for the age: the profile


def test_a_models_table_follows_each_new_measurement_and_the_kinds_ratio() -> None:
    """The whole table a planner reads for a model (``exec_table``) agrees with each size's estimate
    after every measurement, including the first at a size (a new window) and the ratio's moves."""
    sizes = (1, 2, 4, 8)
    for borrow in (True, False):
        estimator = Estimator(PROFILES, borrow_kind_ratio=borrow)
        assert estimator.exec_table("a", sizes, "v100") == [2_000_000, 3_000_000, 5_000_000, 9_000_000]
        steps = [("b", 1, 4_000_000), ("a", 4, 6_000_000), ("a", 4, 4_000_000), ("a", 2, 1_000_000)] * 6
        for model, size, measured in steps:
            estimator.observe_exec(model, size, "v100", measured, at_ns=0)
            for name in ("a", "b"):
                expected = [estimator.exec_ns(name, size, "v100") for size in sizes]
                assert estimator.exec_table(name, sizes, "v100") == expected
        # Measured windows override the profile: a's size 4 (full: its p99) and b's size 1.
        assert estimator.exec_table("a", sizes, "v100")[2] == 6_000_000
        assert estimator.exec_table("b", sizes, "v100")[0] == 4_000_000
    estimator.forget("a")
    assert estimator.exec_table("a", sizes, "v100") == [2_000_000, 3_000_000, 5_000_000, 9_000_000]


def test_reading_a_decaying_rate_does_not_change_it() -> None:
    """Readers may skip reads (the replica check skips its scan): a value depends on what was added
    and when, not on when it was read."""
    read_often, read_never = DecayingRate(tau_ns=1_000), DecayingRate(tau_ns=1_000)
    for rate in (read_often, read_never):
        rate.add(500, now_ns=100)
    for now in range(101, 2_000, 37):
        read_often.value(now)
    for rate in (read_often, read_never):
        rate.add(300, now_ns=2_000)
        rate.add(100, now_ns=1_500)  # a result reported late: added at the newer time's value
    assert read_often.value(2_500) == read_never.value(2_500)
    assert read_often.value(2_000) == read_never.value(2_000) == 500 / 1_000 * math.exp(-1.9) + 0.4


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(1, 12),
    percentile=st.sampled_from([50.0, 90.0, 99.0, 100.0]),
    steps=st.lists(st.one_of(st.integers(0, 30), st.sampled_from(["drop", "clear"])), max_size=80),
)
def test_a_window_percentile_is_the_nearest_rank_of_its_last_values(
    window: int, percentile: float, steps: list[int | str]
) -> None:
    """The percentile kept up to date as values come and go (repeats included) is the one a sort of
    the window's values gives."""
    rolling, last = RollingPercentile(-1, window, percentile), deque[int](maxlen=window)
    for step in steps:
        if step == "clear":
            rolling.clear()
            last.clear()
        elif step == "drop":
            if last:
                rolling.drop_oldest()
                last.popleft()
        else:
            assert isinstance(step, int)
            rolling.add(step)
            last.append(step)
        ordered = sorted(last)
        expected = ordered[max(1, math.ceil(percentile / 100 * len(ordered))) - 1] if ordered else -1
        assert (rolling.value, rolling.count, rolling.full) == (expected, len(last), len(last) == window)
