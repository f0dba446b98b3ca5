"""INFER5 on hand-built cases, each taken from a rule of the authors' ``infer5_scheduler.cpp`` (fbd2f11)."""

from __future__ import annotations

from mainspring.protocol import DeviceSpec, Infer, LoadWeights, Outcome
from mainspring.scheduler.base import Decisions
from mainspring.scheduler.infer5 import Infer5Scheduler
from mainspring.scheduler.infer5.tracker import TRACKER_LAG_NS
from mainspring.time import NS_PER_MS
from tests.fakes import PAGE, ok, profile, request, run_one_device

MS = NS_PER_MS
SIZES_MS = {1: 2.0, 2: 3.0, 4: 5.0, 8: 9.0, 16: 17.0}


def scheduler(*models: str) -> Infer5Scheduler:
    profiles = {name: profile(name, exec_ms=SIZES_MS) for name in models}
    return Infer5Scheduler(profiles, [DeviceSpec(0, "v100", 20 * PAGE, PAGE)])


def loaded(policy: Infer5Scheduler, model: str, now: int, request_id: int) -> int:
    """``model`` loaded by a first request, which is then served; returns the time after (the lane free)."""
    policy.on_request(request(request_id, model, now), now)
    decisions = policy.schedule(now)
    while not decisions.actions:  # the load decision, once the tracker has the request's demand
        assert decisions.wakeup_ns is not None
        now = decisions.wakeup_ns
        decisions = policy.schedule(now)
    (load,) = decisions.actions
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


def held(*resident: tuple[str, ...], trip_ms: float = 0.0) -> Infer5Scheduler:
    """INFER5 over one device per entry of ``resident``, each holding those models already (its worker kept
    the weights); actions take ``trip_ms`` to reach a worker."""
    profiles = {name: profile(name, exec_ms=SIZES_MS) for models in resident for name in models}
    specs = [DeviceSpec(i, "v100", 20 * PAGE, PAGE, resident=models) for i, models in enumerate(resident)]
    return Infer5Scheduler(profiles, specs, network_trip_ns=round(trip_ms * MS))


def test_after_a_failed_strategy_a_model_keeps_only_smaller_sizes_until_it_next_runs() -> None:
    """Strategies last (``GPU::strategies``), and a request that finds its model active changes none.
    a's batch of 8 fails (3 queued) and a keeps sizes 1-4; b's 8 run. Five more of a arrive: a is active,
    so its strategies stay as they were. c's 8, less urgent than a batch of 8 of a would be, go first,
    because a's best is now its size 4; rebuilt from the queues, a's 8 would have gone ahead of c."""
    policy = held(("a", "b", "c"))
    t = 0
    for i in range(3):
        policy.on_request(request(i, "a", t), t)  # scheduling deadline D = t + 95 ms; a8 at D - 9, a4 at D - 5
    for i in range(8):
        policy.on_request(request(10 + i, "b", t, slo_ms=102), t)  # b8 at D - 7
    assert infers(policy.schedule(t)) == [("b", tuple(range(10, 18)))]  # the lane is booked to t + 10 ms
    for i in range(3, 8):
        policy.on_request(request(i, "a", t), t)  # 8 of a wait now
    for i in range(8):
        policy.on_request(request(20 + i, "c", t, slo_ms=103), t)  # c8 at D - 6: after a8, before a4
    assert infers(policy.schedule(t)) == []  # the lane frees past the schedule-ahead
    now = t + MS
    assert infers(policy.schedule(now)) == [("c", tuple(range(20, 28)))]
    # a runs next, and runs all 8: a strategy of size 4 takes the largest batch the queues fill.
    assert infers(policy.schedule(now + 9 * MS)) == [("a", tuple(range(8)))]


def test_a_timed_out_front_still_sets_its_models_priority() -> None:
    """r0 of a times out while a loads (answered then), but stays at the front of a's queues until a batch is
    tried. Its past deadline sets a's priority when a's load ends, so a's 8 later requests run before b's
    request, whose deadline is earlier than theirs."""
    policy = scheduler("a", "b")
    t0 = loaded(policy, "b", 0, 100)
    policy.on_request(request(0, "a", t0, slo_ms=20), t0)  # scheduling deadline t0 + 15 ms
    decisions = policy.schedule(t0)
    while not decisions.actions:
        assert decisions.wakeup_ns is not None
        decisions = policy.schedule(decisions.wakeup_ns)
    (load,) = decisions.actions
    assert isinstance(load, LoadWeights) and load.model == "a"
    t1 = t0 + 5 * MS
    for i in range(1, 9):
        policy.on_request(request(i, "a", t1), t1)  # scheduling deadline t1 + 95 ms
    assert infers(policy.schedule(t1)) == []  # a is not loaded yet
    timeouts = policy.schedule(t0 + 15 * MS).responses
    assert [(r.request_id, r.outcome) for r in timeouts] == [(0, Outcome.QUEUE_TIMEOUT)]
    t_loaded = t0 + 20 * MS
    policy.on_result(ok(load.action_id, 0, t_loaded - 5 * MS, t_loaded), t_loaded)
    policy.on_request(request(50, "b", t_loaded, slo_ms=50), t_loaded)  # deadline t_loaded + 45 ms
    # a8's priority from r0: t0 + 6 ms; from r1 it would be t1 + 86 ms, after b's t_loaded + 43 ms.
    assert infers(policy.schedule(t_loaded)) == [("a", tuple(range(1, 9)))]


def test_a_request_runs_on_its_load_demand_after_its_weights_deadline_passed() -> None:
    """INFER5's tracker keeps a request's load demand until the request runs or times out (its ``process``
    files a deadline for 0 demand). b's request waits behind a 40 ms load of x past its weights deadline
    (25 ms): b is still loaded when the load lane allows, and its request served. INFER4's tracker lets the
    demand lapse there, so b is never loaded and the request times out."""
    profiles = {"x": profile("x", exec_ms=SIZES_MS, load_ms=40), "b": profile("b", exec_ms=SIZES_MS)}
    policy = Infer5Scheduler(profiles, [DeviceSpec(0, "v100", 20 * PAGE, PAGE)])
    policy.on_request(request(0, "x", 0), 0)
    policy.on_request(request(1, "b", MS), MS)
    actions, _ = run_one_device(policy, MS, 100 * MS)
    loads = [a for a in actions if isinstance(a, LoadWeights)]
    served = [i for a in actions if isinstance(a, Infer) for i in a.request_ids]
    assert [load.model for load in loads] == ["x", "b"]
    assert loads[1].earliest_ns > 26 * MS  # decided after b's weights deadline (1 ms + 25 ms)
    assert 1 in served


def test_two_actions_on_the_wire_at_once_and_one_not_sent_in_time_fails() -> None:
    """The send gate: five devices, each holding one model, plan a batch at once; with a 4 ms trip to the
    workers two go now, two when those have arrived and the last at 8 ms, past its send-by (its latest
    start, 11 ms, less 5 ms): it is never sent, and its request is answered as failed at its latest start
    plus its duration."""
    policy = held(("a",), ("b",), ("c",), ("d",), ("e",), trip_ms=4)
    for i, name in enumerate("abcde"):
        policy.on_request(request(i, name, 0), 0)
    sent: dict[int, list[int]] = {}
    answered = []
    now: int | None = 0
    while now is not None and now <= 20 * MS:
        decisions = policy.schedule(now)
        sent[now] = [ids[0] for _, ids in infers(decisions)]
        answered += [(now, r.request_id, r.outcome) for r in decisions.responses]
        now = decisions.wakeup_ns
    assert [len(sent.get(t, [])) for t in (0, 4 * MS, 8 * MS)] == [2, 2, 0]
    (unsent,) = set(range(5)) - {i for ids in sent.values() for i in ids}
    assert answered == [(13 * MS, unsent, Outcome.INFERENCE_FAILED)]  # latest start 11 ms plus 2 ms


def test_a_cold_models_load_waits_for_the_tracker_to_see_its_demand() -> None:
    """INFER5's tracker thread applies a request's demand after the admission thread noted it: the pass at
    its arrival decides no load; the policy wakes once the tracker has run, and the load follows."""
    policy = scheduler("a")
    policy.on_request(request(0, "a", 0), 0)
    first = policy.schedule(0)
    assert first.actions == [] and first.wakeup_ns == TRACKER_LAG_NS
    decisions = policy.schedule(TRACKER_LAG_NS)
    while not decisions.actions:
        assert decisions.wakeup_ns is not None
        decisions = policy.schedule(decisions.wakeup_ns)
    assert [(type(a), a.model) for a in decisions.actions] == [(LoadWeights, "a")]


def test_without_a_trip_to_the_workers_the_gate_holds_nothing() -> None:
    policy = held(("a",), ("b",), ("c",), ("d",), ("e",))
    for i, name in enumerate("abcde"):
        policy.on_request(request(i, name, 0), 0)
    assert len(infers(policy.schedule(0))) == 5
