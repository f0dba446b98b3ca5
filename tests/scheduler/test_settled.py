"""``SettledStrands``: a covered stranded model stays set aside only until something its cover depends on changes."""

from mainspring.scheduler.clockwork.settled import SettledStrands


def test_a_model_is_checked_again_once_the_clock_passes_its_cover() -> None:
    settled = SettledStrands()
    settled.settle("a", until_ns=1_000, devices=(0,))
    settled.settle("b", until_ns=5_000, devices=(1,))
    settled.expire(1_000)  # at ``until`` the counted starts are still what they were
    assert settled.models == {"a", "b"}
    settled.expire(1_001)
    assert settled.models == {"b"}


def test_a_moved_lane_sets_free_every_model_whose_cover_counts_it() -> None:
    settled = SettledStrands()
    settled.settle("a", until_ns=9_000, devices=(0, 1))
    settled.settle("b", until_ns=9_000, devices=(1,))
    settled.settle("c", until_ns=9_000, devices=(2,))
    settled.lanes_moved([1])
    assert settled.models == {"c"}
    settled.lanes_moved([0])  # "a" already left: its other device's entry went with it
    assert settled.models == {"c"}


def test_a_model_set_free_and_settled_again_keeps_only_its_new_cover() -> None:
    settled = SettledStrands()
    settled.settle("a", until_ns=1_000, devices=(0,))
    settled.unsettle(["a", "never-settled"])
    settled.settle("a", until_ns=8_000, devices=(3,))
    settled.expire(2_000)  # the stale entry (until 1,000) no longer applies
    settled.lanes_moved([0])
    assert settled.models == {"a"}
    settled.clear()
    assert not settled.models
    settled.lanes_moved([3])
    settled.expire(10_000)  # nothing left to set free, nothing fails
