"""Routing picks, among a model's cells, one whose signal says it finishes first; a second try only
where another cell's signal meets the deadline."""

from __future__ import annotations

from mainspring.cells.routing import CellSignal, Costs, Router
from mainspring.cells.signal import cell_signal
from mainspring.protocol import DeviceSpec, Infer
from mainspring.scheduler.clockwork.policy import ClockworkScheduler
from mainspring.time import NS_PER_MS
from tests.fakes import PAGE, profile, request

MS = NS_PER_MS
COSTS = Costs(exec_ns=2 * MS, work_ns=1 * MS, load_ns=5 * MS)


def test_the_cell_whose_signal_finishes_first_is_picked() -> None:
    router = Router()
    router.publish(CellSignal(0, 0, 1, {"m": 30 * MS}, 0))
    router.publish(CellSignal(1, 0, 1, {"m": 10 * MS}, 0))
    assert router.pick("m", (0, 1), 0, COSTS) == 1
    assert router.pick("m", (0,), 0, COSTS) == 0  # one cell: no choice, no signal read
    assert router.picks == 1


def test_a_cell_that_does_not_hold_the_model_is_priced_with_its_load() -> None:
    router = Router()
    router.publish(CellSignal(0, 0, 1, {"m": 9 * MS}, 0))  # held, booked until 7 ms
    router.publish(CellSignal(1, 0, 1, {}, 0))  # cold: a load (5 ms) then the batch (2 ms) = 7 ms
    assert router.pick("m", (0, 1), 0, COSTS) == 1
    router.publish(CellSignal(1, 1, 1, {}, 3 * MS))  # its load lane is busy until 3 ms: 10 ms
    assert router.pick("m", (0, 1), 1, COSTS) == 0


def test_work_routed_since_a_signal_spreads_requests_until_the_next() -> None:
    router = Router()
    router.publish(CellSignal(0, 0, 2, {"m": 10 * MS}, 0))
    router.publish(CellSignal(1, 0, 2, {"m": 10 * MS}, 0))
    picks = [router.pick("m", (0, 1), 0, COSTS) for _ in range(8)]
    assert picks.count(0) == picks.count(1) == 4  # equal cells share a burst instead of one taking it all
    router.publish(CellSignal(0, 1, 2, {"m": 10 * MS}, 0))  # a new signal replaces what was added
    assert router.pick("m", (0, 1), 1, COSTS) == 0


def test_an_older_signal_does_not_replace_a_newer_one() -> None:
    router = Router()
    router.publish(CellSignal(0, 5 * MS, 1, {"m": 50 * MS}, 0))
    router.publish(CellSignal(0, 1 * MS, 1, {"m": 6 * MS}, 0))
    router.publish(CellSignal(1, 5 * MS, 1, {"m": 20 * MS}, 0))
    assert router.pick("m", (0, 1), 5 * MS, COSTS) == 1


def test_a_second_try_goes_only_where_the_signal_meets_the_deadline() -> None:
    router = Router()
    router.publish(CellSignal(0, 0, 1, {"m": 90 * MS}, 0))
    router.publish(CellSignal(1, 0, 1, {"m": 40 * MS}, 0))
    assert router.second_choice("m", (0, 1), 0, 0, 50 * MS, COSTS) == 1
    assert router.second_choice("m", (0, 1), 0, 0, 30 * MS, COSTS) is None  # too late there too
    assert router.second_choice("m", (0, 1), 1, 0, 200 * MS, COSTS) == 0
    assert router.second_choice("m", (0,), 0, 0, 200 * MS, COSTS) is None  # no other cell
    assert router.second_tries == 2


def test_the_clockwork_policy_signals_when_its_holders_free_up() -> None:
    devices = [DeviceSpec(0, "v100", 64 * PAGE, PAGE), DeviceSpec(1, "v100", 64 * PAGE, PAGE)]
    policy = ClockworkScheduler({"m": profile("m"), "n": profile("n")}, devices)
    signal = cell_signal(3, policy, 2, 0, ["m", "n"])
    assert signal.cell == 3 and signal.finish_ns == {} and signal.cold_start_ns == 0  # nothing held yet
    policy.on_request(request(1, "m", 0), 0)
    decisions = policy.schedule(0)  # loads m on a device
    load = decisions.actions[0]
    signal = cell_signal(3, policy, 2, 0, ["m", "n"])
    assert set(signal.finish_ns) == {"m"}
    # not before m's weights are in and a batch of one (2 ms) has run after them
    assert signal.finish_ns["m"] >= load.earliest_ns + load.expected_duration_ns + 2 * MS
    assert not any(isinstance(a, Infer) for a in decisions.actions)


def test_infer4_and_infer5_signal_from_their_lanes_and_a_reactive_policy_signals_no_times() -> None:
    import random

    from mainspring.scheduler.registry import make_scheduler

    devices = [DeviceSpec(0, "v100", 64 * PAGE, PAGE), DeviceSpec(1, "v100", 64 * PAGE, PAGE)]
    profiles = {"m": profile("m"), "n": profile("n")}
    for name in ("infer4", "infer5"):
        policy = make_scheduler(name, profiles, devices, random.Random(0), 0, None, "--clockwork")
        assert cell_signal(0, policy, 2, 0, ["m", "n"]).finish_ns == {}  # nothing held yet
        policy.on_request(request(1, "m", 0), 0)
        decisions = policy.schedule(0)
        while not decisions.actions:  # infer5's tracker sees the demand an instant later
            assert decisions.wakeup_ns is not None, name
            decisions = policy.schedule(decisions.wakeup_ns)
        load = decisions.actions[0]  # loads m on a device
        signal = cell_signal(0, policy, 2, 0, ["m", "n"])
        assert set(signal.finish_ns) == {"m"}, name
        assert signal.finish_ns["m"] >= load.earliest_ns + load.expected_duration_ns + 2 * MS, name
    reactive = make_scheduler("triton", profiles, devices, random.Random(0), 0, None, "--clockwork")
    assert cell_signal(0, reactive, 2, 5, ["m"]) == CellSignal(0, 5, 2, {}, 5)
