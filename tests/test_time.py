import pytest

from mainspring.time import ManualClock, WallClock, ms_to_ns, ns_to_ms


def test_manual_clock_moves_only_forward() -> None:
    clock = ManualClock(10)
    clock.advance(5)
    clock.set(20)
    assert clock.now_ns() == 20
    with pytest.raises(ValueError, match="backwards"):
        clock.set(19)
    with pytest.raises(ValueError, match="negative"):
        clock.advance(-1)


def test_wall_clock_is_monotonic_and_units_convert() -> None:
    clock = WallClock()
    assert clock.now_ns() <= clock.now_ns()
    assert ms_to_ns(1.5) == 1_500_000 and ns_to_ms(2_500_000) == 2.5
