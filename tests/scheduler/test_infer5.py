"""INFER5 on hand-built cases, each taken from a rule of the authors' ``infer5_scheduler.cpp`` (fbd2f11)."""

from __future__ import annotations

from mainspring.protocol import DeviceSpec, Infer, LoadWeights, Outcome
from mainspring.scheduler.base import Decisions
from mainspring.scheduler.infer5 import Infer5Scheduler
from mainspring.time import NS_PER_MS
from tests.fakes import PAGE, ok, profile, request

MS = NS_PER_MS
SIZES_MS = {1: 2.0, 2: 3.0, 4: 5.0, 8: 9.0, 16: 17.0}


def scheduler(*models: str) -> Infer5Scheduler:
    profiles = {name: profile(name, exec_ms=SIZES_MS) for name in models}
    return Infer5Scheduler(profiles, [DeviceSpec(0, "v100", 20 * PAGE, PAGE)])


def loaded(policy: Infer5Scheduler, model: str, now: int, request_id: int) -> int:
    """``model`` loaded by a first request, which is then served; returns the time after (the lane free)."""
    policy.on_request(request(request_id, model, now), now)
    (load,) = policy.schedule(now).actions
    assert isinstance(load, LoadWeights) and load.model == model
    now += 5 * MS
    policy.on_result(ok(load.action_id, 0, now - 5 * MS, now), now)
    (infer,) = policy.schedule(now).actions
    assert isinstance(infer, Infer) and infer.request_ids == (request_id,)
    policy.on_result(ok(infer.action_id, 0, now, now + 2 * MS), now + 2 * MS)
    return now + 2 * MS


def infers(decisions: Decisions) -> list[tuple[str, tuple[int, ...]]]:
    return [(a.model, a.request_ids) for a in decisions.actions if isinstance(a, Infer)]


def test_a_batch_is_the_largest_size_every_smaller_queue_fills_and_at_most_eight() -> None:
    policy = scheduler("a")
    now = loaded(policy, "a", 0, 100)
    for i in range(20):
        policy.on_request(request(i, "a", now), now)
    # 20 wait: sizes up to 16 could be filled, but 8 is the largest INFER5 plans; its 9 ms take the lane
    # past the schedule-ahead (10 ms from now, the lane reached 1 ms from now): one batch this pass.
    assert infers(policy.schedule(now)) == [("a", tuple(range(8)))]


def test_five_waiting_make_a_batch_of_four_then_one() -> None:
    policy = scheduler("a")
    now = loaded(policy, "a", 0, 100)
    for i in range(5):
        policy.on_request(request(i, "a", now), now)
    # 8 cannot be filled; 4 can, as 2 and 1 before it: the batch of 4, then the lane (5 ms) is free
    # within the schedule-ahead again and the one left runs after it.
    assert infers(policy.schedule(now)) == [("a", (0, 1, 2, 3)), ("a", (4,))]


def test_a_full_batchs_longer_estimate_puts_it_ahead_of_an_earlier_deadline() -> None:
    policy = scheduler("a", "b")
    now = loaded(policy, "a", 0, 100)
    now = loaded(policy, "b", now, 101)
    for i in range(8):
        policy.on_request(request(i, "a", now), now)  # scheduling deadline +95 ms; 8 take 9 ms: priority +86
    policy.on_request(request(50, "b", now, slo_ms=96), now)  # deadline +91 ms, 1 takes 2 ms: priority +89
    assert infers(policy.schedule(now))[0] == ("a", tuple(range(8)))  # b's deadline is earlier


def test_a_request_only_a_smaller_batch_could_serve_is_passed_over_and_answered_at_its_deadline() -> None:
    """The size-4 queue drops r0 (a batch of 4 would end past its deadline) while sizes 1 and 2 keep it;
    the batch of 4 comes from the requests after it, and every queue catches up past them, so r0 is in
    none any more. It is answered only at its scheduling deadline, timed out, as INFER5's admission
    thread answers it."""
    policy = scheduler("a", "b")
    t0 = loaded(policy, "a", 0, 100)
    t0 = loaded(policy, "b", t0, 101)
    for i in range(8):
        policy.on_request(request(200 + i, "b", t0), t0)
    assert len(infers(policy.schedule(t0))) == 1  # b's 8 from t0 + 1 ms to t0 + 10 ms
    later = t0 + MS // 2
    for i in range(8):
        policy.on_request(request(300 + i, "b", later), later)
    assert len(infers(policy.schedule(later))) == 1  # and 8 more: the lane is booked until t0 + 19 ms
    arrive = t0 + 7 * MS
    policy.on_request(request(0, "a", arrive, slo_ms=20), arrive)  # scheduling deadline t0 + 22 ms
    for i in range(1, 5):
        policy.on_request(request(i, "a", arrive), arrive)
    # The lane frees at t0 + 19 ms: a batch of 2 (3 ms) would end at t0 + 22 ms, in time for r0; one of 4
    # (5 ms) would not. 8 cannot be filled, so the largest is 4, from r1 on.
    decisions = policy.schedule(t0 + 9 * MS + MS // 2)
    assert infers(decisions) == [("a", (1, 2, 3, 4))]
    assert not [r for r in decisions.responses if r.request_id == 0]
    assert not [r for r in policy.schedule(t0 + 21 * MS).responses if r.request_id == 0]
    (timed_out,) = [r for r in policy.schedule(t0 + 22 * MS).responses if r.request_id == 0]
    assert timed_out.outcome is Outcome.QUEUE_TIMEOUT
