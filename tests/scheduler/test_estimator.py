from mainspring.scheduler.clockwork.estimator import DecayingRate, Estimator, RollingPercentile
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


def test_measurements_age_out_oldest_first() -> None:
    estimator = Estimator(PROFILES, max_age_ns=1_000)
    estimator.observe_exec("a", 1, "v100", 900_000_000, at_ns=0)  # one stall
    for at in range(100, 1_000, 100):
        estimator.observe_exec("a", 1, "v100", 2_100_000, at_ns=at)
    assert estimator.exec_ns("a", 1, "v100") == 900_000_000  # the p99 of ten is their maximum
    estimator.expire(1_050)  # the stall is over a microsecond old; the nine since are not
    assert estimator.exec_ns("a", 1, "v100") == 2_100_000
    estimator.expire(10_000)  # nothing left: back to the profile
    assert estimator.exec_ns("a", 1, "v100") == 2_000_000


def test_an_expiry_skips_values_the_window_already_let_go() -> None:
    estimator = Estimator(PROFILES, window=2, percentile=50.0, max_age_ns=1_000)
    for at, value in [(0, 9_000_000), (10, 3_000_000), (2_000, 4_000_000), (2_010, 5_000_000)]:
        estimator.observe_exec("a", 1, "v100", value, at_ns=at)  # the first two fall out by count
    estimator.expire(2_500)  # their expiry must not drop the two that replaced them
    assert estimator.exec_ns("a", 1, "v100") == 4_000_000
