import pytest

from mainspring.sim.engine import PRIORITY_ARRIVAL, PRIORITY_RESULT, PRIORITY_WAKEUP, EventLoop


def test_events_run_by_time_then_priority_then_insertion() -> None:
    loop = EventLoop()
    seen: list[str] = []
    loop.call_at(20, lambda: seen.append("late"))
    loop.call_at(10, lambda: seen.append("arrival-1"), PRIORITY_ARRIVAL)
    loop.call_at(10, lambda: seen.append("result"), PRIORITY_RESULT)
    loop.call_at(10, lambda: seen.append("arrival-2"), PRIORITY_ARRIVAL)
    loop.run()
    assert seen == ["result", "arrival-1", "arrival-2", "late"]
    assert loop.now_ns() == 20 and loop.events_processed == 4


def test_run_until_stops_and_advances_the_clock() -> None:
    loop = EventLoop()
    seen: list[int] = []
    for t in (5, 15):
        loop.call_at(t, lambda t=t: seen.append(t))  # type: ignore[misc]
    loop.run(until_ns=10)
    assert seen == [5] and loop.now_ns() == 10 and loop.pending() == 1


def test_callbacks_may_schedule_more_and_stop_early() -> None:
    loop = EventLoop()
    count = [0]

    def tick() -> None:
        count[0] += 1
        loop.call_at(loop.now_ns() + 1, tick)

    loop.call_at(0, tick)
    loop.run(stop=lambda: count[0] >= 5)
    assert count[0] == 5 and loop.now_ns() == 4


def test_scheduling_in_the_past_is_an_error() -> None:
    loop = EventLoop(start_ns=100)
    with pytest.raises(ValueError, match="past"):
        loop.call_at(99, lambda: None)


def test_a_deferred_callback_runs_after_every_event_of_its_instant() -> None:
    """Even after events scheduled at that instant once it was deferred, and before the next instant."""
    loop = EventLoop()
    seen: list[str] = []

    def result() -> None:
        seen.append("result")
        loop.defer(lambda: seen.append("pass"))
        loop.call_at(10, lambda: seen.append("follow-up"), PRIORITY_ARRIVAL)

    loop.call_at(10, result, PRIORITY_RESULT)
    loop.call_at(10, lambda: seen.append("wake-up"), PRIORITY_WAKEUP)
    loop.call_at(11, lambda: seen.append("next"), PRIORITY_RESULT)
    loop.run()
    assert seen == ["result", "follow-up", "wake-up", "pass", "next"]
