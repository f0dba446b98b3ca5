"""The cells' membership state machine: each transition, and exactly the effects the port must carry out."""

from __future__ import annotations

from mainspring.cells.membership import STALE_NS, Do, Effect, Membership, Phase
from mainspring.cells.placement import CellCapacity
from mainspring.protocol.pages import DEFAULT_POOL_BYTES
from mainspring.time import ManualClock


def live_cell(settles: bool = True) -> tuple[Membership, ManualClock]:
    """Cell 0, joined and signalling (run 1), at t = 0."""
    clock = ManualClock()
    members = Membership(clock, settles=settles)
    members.add()
    assert members.signal(0, incarnation=1) == []
    assert members.joined(0) == []
    assert members.phase(0) is Phase.LIVE
    return members, clock


def kinds(effects: list[Effect]) -> list[Do]:
    return [effect.do for effect in effects]


def test_a_cell_joins_live_when_its_signal_is_fresh_and_silent_when_it_is_not() -> None:
    clock = ManualClock()
    members = Membership(clock)
    members.add()
    members.add()
    members.signal(0, 1)
    members.signal(1, 1)
    assert members.phase(0) is Phase.JOINING and not members.is_live(0)  # heard, not taken in yet
    members.joined(0)
    clock.advance(STALE_NS + 1)
    members.joined(1)
    assert (members.phase(0), members.phase(1)) == (Phase.LIVE, Phase.SILENT)


def test_a_cell_added_late_settles_one_of_the_start_does_not() -> None:
    members = Membership(ManualClock(), settles=True)
    assert members.add() == (0, [])
    assert members.add(late=True) == (1, [Effect(Do.SETTLE, 1)])
    assert Membership(ManualClock(), settles=False).add(late=True) == (0, [])  # a frontend process's port


def test_a_stale_signal_turns_a_live_cell_silent_once_and_a_signal_makes_it_live_again() -> None:
    members, clock = live_cell()
    clock.set(STALE_NS)
    assert members.tick() == [] and members.is_live(0)  # at the bound: still live
    clock.set(STALE_NS + 1)
    assert not members.is_live(0)  # read at once, whatever tick has seen
    assert kinds(members.tick()) == [Do.WARN] and members.phase(0) is Phase.SILENT
    assert members.tick() == []  # logged once
    assert members.reachable() == [0]  # a silent cell still answers what it holds
    assert members.signal(0, 1) == [Effect(Do.LOG, 0, "cell 0 signals again")]
    assert members.phase(0) is Phase.LIVE and members.is_live(0)


def test_a_signal_from_a_new_run_fails_the_old_runs_calls_and_rejoins_it() -> None:
    members, _ = live_cell()
    effects = members.signal(0, incarnation=2)
    assert effects == [Effect(Do.FAIL_WAITING, 0, "it was restarted"), Effect(Do.SETTLE, 0), Effect(Do.REJOIN, 0)]
    assert members.phase(0) is Phase.JOINING and members.reachable() == [] and not members.is_live(0)
    assert members.signal(0, incarnation=2) == []  # one rejoin per run: JOINING does not ask again


def test_an_exit_fails_the_calls_drops_the_socket_and_settles_once() -> None:
    members, _ = live_cell()
    why = "its process exited with code -9"
    assert members.exited(0, why) == [Effect(Do.FAIL_WAITING, 0, why), Effect(Do.DISCONNECT, 0), Effect(Do.SETTLE, 0)]
    assert members.phase(0) is Phase.DEAD and members.down(0)
    assert members.exited(0, "its channel closed") == []  # idempotent


def test_a_dead_cell_that_signals_is_rejoined_once() -> None:
    members, _ = live_cell()
    members.exited(0, "gone")
    assert members.signal(0, incarnation=2) == [Effect(Do.REJOIN, 0)]
    assert members.phase(0) is Phase.JOINING
    assert members.signal(0, incarnation=2) == []


def test_an_exit_while_a_rejoin_is_under_way_leaves_the_socket_to_it() -> None:
    members, _ = live_cell()
    members.exited(0, "gone")
    members.signal(0, 2)
    assert kinds(members.exited(0, "its channel closed")) == [Do.FAIL_WAITING]  # settling already
    assert members.phase(0) is Phase.DEAD


def test_a_call_a_live_cell_never_ran_rejoins_it_without_failing_the_others() -> None:
    members, _ = live_cell()
    assert members.never_ran(0) == [Effect(Do.REJOIN, 0)]
    assert members.phase(0) is Phase.JOINING and members.reachable() == []
    assert members.never_ran(0) == []  # a rejoin is under way


def test_a_rejoin_that_worked_brings_the_cell_back_one_that_failed_waits_for_the_next_signal() -> None:
    members, clock = live_cell()
    members.never_ran(0)
    assert members.rejoined(0, ok=True) == [Effect(Do.LOG, 0, "cell 0 is back")]
    assert members.phase(0) is Phase.LIVE
    members.never_ran(0)
    assert kinds(members.rejoined(0, ok=False, why="timeout")) == [Do.WARN]
    assert members.phase(0) is Phase.DEAD
    clock.advance(10)
    assert members.signal(0, 1) == [Effect(Do.REJOIN, 0)]  # tried again


def test_a_departed_cell_counts_nowhere_and_a_rejoin_ending_after_it_drops_the_socket() -> None:
    members, _ = live_cell()
    members.report(0, devices=2, pool_bytes=10)
    members.never_ran(0)
    # a rejoin under way replaces the socket; nothing to settle for good
    assert members.departed(0, "its node left") == [Effect(Do.FAIL_WAITING, 0, "its node left")]
    assert members.phase(0) is Phase.DEPARTED and not members.members[0].settling
    assert members.present() == [] and members.capacities() == [] and members.reachable() == []
    assert members.signal(0, 1) == [] and members.exited(0, "x") == [] and members.departed(0, "y") == []
    assert members.rejoined(0, ok=True) == [Effect(Do.DISCONNECT, 0)]  # it stays gone


def test_a_dead_cell_departs_without_effects() -> None:
    members, _ = live_cell()
    members.exited(0, "gone")
    assert members.departed(0, "its node left") == []
    assert members.phase(0) is Phase.DEPARTED


def test_a_restarting_cell_keeps_its_last_capacity_and_an_old_cell_gets_the_default_pool() -> None:
    members, _ = live_cell()
    members.add()
    members.report(0, devices=2, pool_bytes=3 * 2**30)
    members.report(1, devices=0, pool_bytes=0)  # not reported yet: not planned
    assert members.capacities() == [CellCapacity(0, 2, 3 * 2**30)]
    members.exited(0, "restarting")
    members.report(0, devices=0, pool_bytes=0)  # its workers not back yet
    members.report(1, devices=4, pool_bytes=0)  # a cell that does not say its pools
    assert members.capacities() == [CellCapacity(0, 2, 3 * 2**30), CellCapacity(1, 4, 4 * DEFAULT_POOL_BYTES)]


def test_settled_clears_settling_and_a_settling_cell_is_not_settled_twice() -> None:
    members, _ = live_cell()
    members.exited(0, "gone")
    assert members.members[0].settling
    members.signal(0, 2)
    assert kinds(members.rejoined(0, ok=True)) == [Do.LOG]
    assert kinds(members.signal(0, 3)) == [Do.FAIL_WAITING, Do.REJOIN]  # still settling: no second SETTLE
    members.settled(0)
    assert not members.members[0].settling
