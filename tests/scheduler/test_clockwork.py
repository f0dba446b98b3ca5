"""The Clockwork policy fed by hand, as vLLM tests its scheduler: no devices, no clock."""

from mainspring.protocol import (
    ActionResult,
    ActionStatus,
    DeviceSpec,
    EvictWeights,
    Infer,
    LoadWeights,
    Outcome,
    ResponseStatus,
)
from mainspring.scheduler.base import Decisions
from mainspring.scheduler.clockwork import ClockworkConfig, ClockworkScheduler
from mainspring.time import NS_PER_MS
from tests.fakes import PAGE, ok, profile, request

MS = NS_PER_MS
# Exec: batch 1: 2 ms, 2: 3 ms, 4: 5 ms, 8: 9 ms. Load: 5 ms. Four pages each.
PROFILES = {name: profile(name, pages=4) for name in ("a", "b", "c", "d")}


def scheduler(devices: int = 1, pages: int = 100, **config: float) -> ClockworkScheduler:
    specs = [DeviceSpec(i, "v100", pages * PAGE, PAGE) for i in range(devices)]
    return ClockworkScheduler(PROFILES, specs, ClockworkConfig(**config))  # type: ignore[arg-type]


def warm(policy: ClockworkScheduler, model: str, device: int = 0, at: int = 0) -> int:
    """Get ``model`` loaded on ``device`` by a request, serve it; returns the time after."""
    policy.on_request(request(10_000 + at, model, at), at)
    loads = [a for a in policy.schedule(at).actions if isinstance(a, LoadWeights)]
    (load,) = [a for a in loads if a.model == model]
    assert load.device == device
    end = at + 5 * MS
    policy.on_result(ok(load.action_id, device, at, end), end)
    (infer,) = policy.schedule(end).actions
    assert isinstance(infer, Infer)
    done = end + 2 * MS
    policy.on_result(ok(infer.action_id, device, end, done), done)
    policy.schedule(done)
    return done


def infers(decisions: Decisions) -> list[Infer]:
    return [a for a in decisions.actions if isinstance(a, Infer)]


def test_batch_is_the_largest_that_meets_every_deadline() -> None:
    policy = scheduler()
    now = warm(policy, "a")
    # Six requests; the most urgent can wait 6 ms: batch 4 (5 ms) fits, batch 8 (9 ms) does not.
    for i in range(6):
        policy.on_request(request(i, "a", now, slo_ms=6 if i == 0 else 50), now)
    (first, *_) = infers(policy.schedule(now))
    assert first.batch_size == 4 and first.request_ids == (0, 1, 2, 3)
    assert first.earliest_ns == now and first.expected_duration_ns == 5 * MS
    assert first.latest_ns == now + 1 * MS  # the latest start that still meets request 0
    # With a relaxed head deadline seven requests go as one padded batch of 8 (9 ms; 4 + 2 + 1: 10 ms).
    policy = scheduler()
    now = warm(policy, "a")
    for i in range(7):
        policy.on_request(request(i, "a", now), now)
    (batch,) = infers(policy.schedule(now))
    assert batch.batch_size == 8 and len(batch.request_ids) == 7
    assert batch.latest_ns == now + 5 * MS  # capped at earliest + slack (the horizon)


def test_a_padded_batch_that_costs_more_than_full_smaller_ones_is_split() -> None:
    # Six requests padded to 8 take 9 ms of the lane; a batch of 4 and one of 2 take 8 ms and end
    # them all sooner: 4 now, the other 2 when the lane frees (within the horizon: planned at once).
    policy = scheduler()
    now = warm(policy, "a")
    for i in range(6):
        policy.on_request(request(i, "a", now), now)
    first, second = infers(policy.schedule(now))
    assert first.batch_size == 4 and first.request_ids == (0, 1, 2, 3)
    assert second.batch_size == 2 and second.request_ids == (4, 5)
    # Without split_padding, the padded batch of 8.
    policy = scheduler(split_padding=False)
    now = warm(policy, "a")
    for i in range(6):
        policy.on_request(request(i, "a", now), now)
    (batch,) = infers(policy.schedule(now))
    assert batch.batch_size == 8 and len(batch.request_ids) == 6


def test_early_rejection_at_arrival_with_the_reason() -> None:
    policy = scheduler()
    now = warm(policy, "a")
    policy.on_request(request(1, "a", now, slo_ms=1.5), now)  # batch-1 takes 2 ms
    policy.on_request(request(2, "b", now, slo_ms=6), now)  # cold: 5 ms load + 2 ms exec
    policy.on_request(request(3, "a", now, slo_ms=2.5), now)  # an SLO under 5 ms that can be met
    decisions = policy.schedule(now)
    rejected = {r.request_id: r for r in decisions.responses}
    assert set(rejected) == {1, 2}
    assert all(
        r.outcome is Outcome.DEADLINE_AT_ARRIVAL and r.status is ResponseStatus.REJECTED for r in rejected.values()
    )
    assert "SLO 1.50 ms" in rejected[1].reason
    assert [i.request_ids for i in infers(decisions)] == [(3,)]


def test_queued_requests_are_rejected_as_soon_as_they_cannot_make_it() -> None:
    policy = scheduler()
    now = warm(policy, "a")
    policy.on_request(request(1, "a", now, slo_ms=50), now)
    (long_batch,) = infers(policy.schedule(now))
    policy.on_request(request(2, "a", now, slo_ms=4), now)  # lane busy for 2 ms, then 2 ms: just fits
    decisions = policy.schedule(now)
    assert decisions.responses == []
    (second,) = infers(decisions)
    # May start as soon as the lane frees (earliest = now), and must by 2 ms to make its deadline.
    assert second.request_ids == (2,) and second.earliest_ns == now and second.latest_ns == now + 2 * MS
    # The first batch runs 3 ms late; the second is refused as too late and cannot make it any more.
    policy.on_result(ok(long_batch.action_id, 0, now, now + 5 * MS), now + 5 * MS)
    policy.on_result(ActionResult(second.action_id, 0, ActionStatus.TOO_LATE), now + 5 * MS)
    (rejection,) = policy.schedule(now + 5 * MS).responses[1:]
    assert rejection.request_id == 2 and rejection.status is ResponseStatus.REJECTED


def test_a_late_result_shifts_the_predicted_free_time() -> None:
    policy = scheduler()
    now = warm(policy, "a")
    policy.on_request(request(1, "a", now), now)
    (infer,) = infers(policy.schedule(now))
    lane = policy.residency.devices[0].exec_lane
    assert lane.free_ns == now + 2 * MS
    policy.on_result(ok(infer.action_id, 0, now, now + 7 * MS), now + 7 * MS)  # 5 ms late
    assert lane.free_ns == now + 7 * MS
    policy.on_request(request(2, "a", now + 7 * MS), now + 7 * MS)
    (next_infer,) = infers(policy.schedule(now + 7 * MS))
    assert next_infer.earliest_ns == now + 7 * MS
    # The estimate learned from the measurement: p99 of the window is the 7 ms run.
    assert next_infer.expected_duration_ns == 7 * MS


def test_refused_batch_that_can_still_make_it_is_requeued() -> None:
    policy = scheduler()
    now = warm(policy, "a")
    policy.on_request(request(1, "a", now), now)
    (infer,) = infers(policy.schedule(now))
    policy.on_result(ActionResult(infer.action_id, 0, ActionStatus.TOO_EARLY), now + MS)
    (again,) = infers(policy.schedule(now + MS))
    assert again.request_ids == (1,)


def test_cold_load_and_the_infer_after_it() -> None:
    policy = scheduler()
    policy.on_request(request(1, "a", 0), 0)
    decisions = policy.schedule(0)
    (load,) = decisions.actions
    assert isinstance(load, LoadWeights) and load.expected_duration_ns == 5 * MS
    assert decisions.wakeup_ns is not None
    assert infers(policy.schedule(MS)) == []  # never planned before the load reports
    policy.on_result(ok(load.action_id, 0, 0, 6 * MS), 6 * MS)
    (infer,) = infers(policy.schedule(6 * MS))
    assert infer.request_ids == (1,) and infer.earliest_ns == 6 * MS


def test_eviction_prefers_least_recently_used_idle_models() -> None:
    policy = scheduler(pages=12)  # room for three models
    now = 0
    for model in ("a", "b", "c"):
        now = warm(policy, model, at=now)
    policy.on_request(request(1, "a", now), now)  # "a" is the LRU model but has queued demand
    decisions = policy.schedule(now)
    (served,) = infers(decisions)
    policy.on_result(ok(served.action_id, 0, now, now + 2 * MS), now + 2 * MS)
    now += 2 * MS
    policy.schedule(now)
    policy.on_request(request(2, "d", now), now)
    evict, load = policy.schedule(now).actions
    assert isinstance(evict, EvictWeights) and evict.model == "b"  # LRU among the idle ones
    assert isinstance(load, LoadWeights) and load.model == "d"
    assert evict.earliest_ns <= load.earliest_ns


def serve(policy: ClockworkScheduler, model: str, request_id: int, at: int, took_ns: int = 2 * MS) -> int:
    """One request of a loaded ``model`` served on device 0 in ``took_ns``; returns the time after."""
    policy.on_request(request(request_id, model, at), at)
    (infer,) = infers(policy.schedule(at))
    done = at + took_ns
    policy.on_result(ok(infer.action_id, 0, at, done), done)
    policy.schedule(done)
    return done


def test_eviction_spares_a_popular_model_that_was_used_less_recently() -> None:
    for by_popularity, victim in ((True, "b"), (False, "a")):
        policy = scheduler(pages=12, evict_by_popularity=by_popularity)  # room for three models
        now = 0
        for model in ("a", "b", "c"):
            now = warm(policy, model, at=now)  # the pool is full: arrivals count from here
        for i, model in enumerate(("a", "a", "a", "a", "b", "c")):
            now = serve(policy, model, i, now)  # "a" the least recently used, and the most popular
        policy.on_request(request(9, "d", now), now)
        evict, load = policy.schedule(now).actions
        assert isinstance(evict, EvictWeights) and evict.model == victim  # LRU: "a"; by popularity: "b"
        assert isinstance(load, LoadWeights) and load.model == "d"


def test_models_in_use_are_never_evicted() -> None:
    policy = scheduler(pages=8)  # room for two models
    now = warm(policy, "a")
    now = warm(policy, "b", at=now)
    for i in range(3):
        policy.on_request(request(i, "a" if i < 2 else "b", now), now)
    policy.on_request(request(9, "c", now), now)
    decisions = policy.schedule(now)
    assert not [a for a in decisions.actions if isinstance(a, EvictWeights)]  # both busy or queued


def test_cold_loads_go_to_the_most_urgent_model_first() -> None:
    policy = scheduler(devices=1)
    policy.on_request(request(1, "a", 0, slo_ms=100), 0)
    policy.on_request(request(2, "b", 0, slo_ms=30), 0)
    (load,) = policy.schedule(0).actions
    assert isinstance(load, LoadWeights) and load.model == "b"


def hot_stream(policy: ClockworkScheduler, model: str, start: int, rate_per_ms: int, duration_ms: int) -> int:
    """Requests at ``rate_per_ms`` for ``duration_ms``; returns the time after."""
    request_id = 100_000
    for ms in range(duration_ms):
        for _ in range(rate_per_ms):
            request_id += 1
            now = start + ms * MS
            policy.on_request(request(request_id, model, now, slo_ms=20), now)
    return start + duration_ms * MS


def test_a_hot_model_gets_a_replica_on_another_device() -> None:
    policy = scheduler(devices=2)
    warm(policy, "a")
    assert policy.residency.holders["a"] == {0}
    # Two requests a millisecond at 2 ms each: four devices' worth, for 400 ms.
    now = hot_stream(policy, "a", 12 * MS, 2, 400)
    sent = policy.schedule(now).actions  # nothing was served meanwhile: most of the queue expires
    now += 10 * MS
    for i in range(30):  # more than device 0 plans within its horizon
        policy.on_request(request(i, "a", now, slo_ms=50), now)
    sent += policy.schedule(now).actions
    (replica,) = [a for a in sent if isinstance(a, LoadWeights)]
    assert replica.model == "a" and replica.device == 1
    assert policy.residency.holders["a"] == {0, 1}


def test_load_priority_is_demand_minus_what_holders_serve() -> None:
    policy = scheduler(devices=2)
    now = warm(policy, "a")
    now = warm(policy, "b", device=1, at=now)
    now = hot_stream(policy, "a", now, 2, 400)
    policy.on_request(request(99, "b", now, slo_ms=20), now)
    priorities, device_load = policy.loads.load_priorities(now)
    assert device_load[0] > 1.0 > device_load[1]
    assert priorities["a"] > 0.3 and priorities["b"] == 0.0


def test_a_burst_beyond_what_the_devices_can_serve_is_rejected_at_once() -> None:
    policy = scheduler()
    now = warm(policy, "a")
    for i in range(200):  # 20 ms SLO; batches of 8 in 9 ms: 16 fit
        policy.on_request(request(i, "a", now, slo_ms=20), now)
    rejected = [r for r in policy.schedule(now).responses if r.status is ResponseStatus.REJECTED]
    assert 180 <= len(rejected) <= 186  # about 16 admitted
    assert all("deadline cannot be met" in r.reason for r in rejected)


def test_a_fleet_of_two_kinds_is_planned_with_each_kind_s_estimates() -> None:
    """Device 1 is of a second, synthetic kind three times slower than the profile; only it fits "a"."""
    specs = [DeviceSpec(0, "v100", 2 * PAGE, PAGE), DeviceSpec(1, "slow", 100 * PAGE, PAGE)]
    policy = ClockworkScheduler(PROFILES, specs, ClockworkConfig())
    policy.on_request(request(100, "a", 0), 0)
    (load,) = [a for a in policy.schedule(0).actions if isinstance(a, LoadWeights)]
    assert load.device == 1
    policy.on_result(ok(load.action_id, 1, 0, 5 * MS), 5 * MS)
    (infer,) = infers(policy.schedule(5 * MS))
    policy.on_result(ok(infer.action_id, 1, 5 * MS, 11 * MS), 11 * MS)  # batch 1: 6 ms, not 2
    now = 11 * MS
    policy.schedule(now)
    # Eight requests with 16 ms to go: on the slow kind a batch of 4 takes 15 ms and one of 8
    # takes 27, so four are admitted; on the profile's kind all eight would fit (9 ms).
    for i in range(8):
        policy.on_request(request(i, "a", now, slo_ms=16), now)
    decisions = policy.schedule(now)
    rejected = [r for r in decisions.responses if r.status is ResponseStatus.REJECTED]
    assert len(rejected) == 4 and all("deadline cannot be met" in r.reason for r in rejected)
    (batch,) = infers(decisions)
    assert batch.device == 1 and batch.batch_size == 4 and batch.expected_duration_ns == 15 * MS


def stall(policy: ClockworkScheduler) -> int:
    """Warm model "a", then measure one of its 2 ms batches at three seconds; returns that moment."""
    now = warm(policy, "a")
    return serve(policy, "a", 1, now, took_ns=3_000 * MS)


def test_one_stall_does_not_lock_a_model_out_for_good() -> None:
    policy = scheduler(estimate_max_age_s=1.0, probe_after_ms=None)  # default 60 s; without probes, ageing
    stalled = stall(policy)
    policy.on_request(request(2, "a", stalled, slo_ms=100), stalled)
    (refused,) = policy.schedule(stalled).responses
    assert refused.status is ResponseStatus.REJECTED and "deadline cannot be met" in refused.reason
    later = stalled + 1_001 * MS  # the stall's measurement has aged out
    policy.on_request(request(3, "a", later, slo_ms=100), later)
    (served,) = infers(policy.schedule(later))
    assert served.request_ids == (3,)


def test_a_model_its_stale_estimates_refuse_is_probed_and_served_again() -> None:
    policy = scheduler()  # measurements count for 60 s; a probe at most every second
    stalled = stall(policy)
    # just measured: the estimate is evidence, and refuses
    policy.on_request(request(2, "a", stalled, slo_ms=100), stalled)
    (refused,) = policy.schedule(stalled).responses
    assert refused.request_id == 2 and "deadline cannot be met" in refused.reason
    # a second later, nothing measured since: the idle device runs one request anyway, at once, alone
    later = stalled + 1_000 * MS
    policy.on_request(request(3, "a", later, slo_ms=100), later)
    (probe,) = infers(policy.schedule(later))
    assert probe.request_ids == (3,) and probe.batch_size == 1 and probe.earliest_ns == later
    # one probe at a time: meanwhile the estimate refuses as before
    policy.on_request(request(5, "a", later + MS, slo_ms=100), later + MS)
    (refused,) = policy.schedule(later + MS).responses
    assert refused.request_id == 5 and "deadline cannot be met" in refused.reason
    # the probe took 2 ms: its request is served, and that measurement replaces the stall's estimate
    done = later + 3 * MS
    policy.on_result(ok(probe.action_id, 0, later + MS, done), done)
    (answered,) = policy.schedule(done).responses
    assert answered.request_id == 3 and answered.status is ResponseStatus.SUCCESS
    policy.on_request(request(4, "a", done, slo_ms=100), done)
    (served,) = infers(policy.schedule(done))
    assert served.request_ids == (4,) and served.expected_duration_ns == 2 * MS


def test_a_never_measured_model_is_probed_once() -> None:
    policy = scheduler()
    policy.on_request(request(1, "b", 0, slo_ms=1.5), 0)  # cold, and faster than its 2 ms batch 1 anyway
    decisions = policy.schedule(0)
    assert [r.request_id for r in decisions.responses] == [1]
    (load,) = [a for a in decisions.actions if isinstance(a, LoadWeights)]  # loaded while memory is idle
    policy.on_result(ok(load.action_id, 0, 0, 5 * MS), 5 * MS)
    policy.schedule(5 * MS)
    # held and never measured: its profile alone refuses, so one request runs to measure it
    first = 1_000 * MS
    policy.on_request(request(2, "b", first, slo_ms=1.5), first)
    (probe,) = infers(policy.schedule(first))
    assert probe.request_ids == (2,)
    done = first + 2 * MS  # the profile was right: 2 ms, and the probe's answer is late
    policy.on_result(ok(probe.action_id, 0, first, done), done)
    policy.schedule(done)
    # measured, and near its profile: refused as before, lately measured or not
    for at in (done + MS, done + 2_000 * MS):
        policy.on_request(request(at, "b", at, slo_ms=1.5), at)
        (refused,) = policy.schedule(at).responses
        assert refused.request_id == at and "deadline cannot be met" in refused.reason


def test_no_probe_for_a_deadline_the_profile_misses_by_far() -> None:
    policy = scheduler()
    policy.on_request(request(1, "b", 0, slo_ms=1.5), 0)
    (load,) = [a for a in policy.schedule(0).actions if isinstance(a, LoadWeights)]
    policy.on_result(ok(load.action_id, 0, 0, 5 * MS), 5 * MS)
    policy.schedule(5 * MS)
    # held and never measured, but 1 ms is half its 2 ms profile: no busy machine's profile is that
    # far off, so running it could only answer late (a 50 us timeout on a live server did just that)
    at = 1_000 * MS
    policy.on_request(request(2, "b", at, slo_ms=1.0), at)
    decisions = policy.schedule(at)
    assert not infers(decisions)
    (refused,) = decisions.responses
    assert refused.request_id == 2 and "deadline cannot be met" in refused.reason


def test_no_probe_while_the_holder_is_busy() -> None:
    policy = scheduler()
    now = warm(policy, "a")
    for _ in range(10):
        for size in (1, 2, 4, 8):
            policy.estimator.observe_exec("a", size, "v100", 50 * MS, at_ns=now)  # the model really takes 50 ms
    policy.on_request(request(1, "a", now, slo_ms=60), now)
    (busy,) = infers(policy.schedule(now))
    policy.on_request(request(2, "a", now + MS, slo_ms=20), now + MS)  # cannot make it, and the lane is busy
    (refused,) = policy.schedule(now + MS).responses
    assert refused.request_id == 2 and "deadline cannot be met" in refused.reason and busy.request_ids == (1,)


def test_a_spike_in_one_batch_size_s_estimate_plans_it_at_the_larger_size_s() -> None:
    policy = scheduler()
    now = warm(policy, "a")
    for _ in range(10):
        policy.estimator.observe_exec("a", 8, "v100", 9 * MS, at_ns=now)
    policy.estimator.observe_exec("a", 4, "v100", 20 * MS, at_ns=now)  # one spike: batch 4 now looks slower than 8
    for i in range(3):
        policy.on_request(request(i, "a", now, slo_ms=10), now)
    (batch,) = infers(policy.schedule(now))
    # A batch of 4 runs no slower than one of 8: planned at 8's 9 ms (meets the deadline), and run at
    # 4, so that its window is measured again instead of padding past it for good.
    assert batch.batch_size == 4 and batch.request_ids == (0, 1, 2) and batch.expected_duration_ns == 9 * MS
    assert batch.latest_ns >= batch.earliest_ns  # never an action that cannot start in time


def test_admission_counts_a_queue_as_the_planner_would_split_it() -> None:
    """A stall in the largest size's window (40 ms for a 9 ms batch of 8): five queued requests take a
    batch of 4 and one of 1 (7 ms), as the planner runs them, not a padded batch of 8, so a fifth
    request due in 12 ms is admitted and served."""
    policy = scheduler()
    now = warm(policy, "a")
    for _ in range(100):  # the kind's ratio: one stall among a hundred measurements does not move its p99
        policy.estimator.observe_exec("b", 1, "v100", 2 * MS, at_ns=now)
    for measured in [9 * MS] * 9 + [40 * MS]:
        policy.estimator.observe_exec("a", 8, "v100", measured, at_ns=now)
    for i in range(5):
        policy.on_request(request(i, "a", now, slo_ms=12), now)
    decisions = policy.schedule(now)
    assert not decisions.responses
    assert [(i.batch_size, i.request_ids) for i in infers(decisions)] == [(4, (0, 1, 2, 3)), (1, (4,))]


def test_a_spike_in_the_smallest_batch_s_estimate_does_not_turn_a_lone_request_away() -> None:
    """Found live by ``mainspring analyze``: one stall in batch 1's window (104 ms for a 15 ms batch)
    refused every request that arrived alone, though batch 2's estimate met the SLO."""
    policy = scheduler()
    now = warm(policy, "a")
    for _ in range(10):
        policy.estimator.observe_exec("a", 2, "v100", 3 * MS, at_ns=now)
    policy.estimator.observe_exec("a", 1, "v100", 12 * MS, at_ns=now)  # one stall: batch 1 looks slower than 2
    policy.on_request(request(1, "a", now, slo_ms=10), now)
    decisions = policy.schedule(now)
    assert not decisions.responses  # admitted
    (batch,) = infers(decisions)
    assert batch.batch_size == 1 and batch.request_ids == (1,) and batch.expected_duration_ns == 3 * MS


def contended(b_slo_ms: float, shedding: bool = True) -> list[Infer]:
    """Model a: one request that must start now (batch 1: 2 ms); model b: eight (batch 8: 9 ms)."""
    policy = scheduler(max_batch_slo_fraction=1.0)  # let a batch take all of an SLO this short
    now = warm(policy, "b", at=warm(policy, "a"))
    if shedding:  # as if most of what the device was recently asked for had expired in its queues
        policy.residency.devices[0].expired.add(100.0, now)
    policy.on_request(request(1, "a", now, slo_ms=3), now)
    for i in range(8):
        policy.on_request(request(10 + i, "b", now, slo_ms=b_slo_ms), now)
    return infers(policy.schedule(now))


def test_past_saturation_the_batch_that_serves_more_per_ms_runs() -> None:
    # Both cannot make it (2 + 9 ms > 10 ms): the eight requests of b go before the one of a.
    (first, *_) = contended(b_slo_ms=10)
    assert first.model == "b" and first.batch_size == 8
    # When deadline order serves both (2 + 9 ms <= 12 ms), it stays.
    first, second = contended(b_slo_ms=12)
    assert (first.model, second.model) == ("a", "b") and second.batch_size == 8
    # A device that is not shedding load keeps deadline order (a transient burst, not saturation).
    (first, *_) = contended(b_slo_ms=10, shedding=False)
    assert first.model == "a"


def stranded_behind_slow(idle_devices: int, a_requests: int = 1) -> tuple[ClockworkScheduler, int]:
    """Models "a" and "slow" on device 0, ``idle_devices`` more joined empty; three slow requests
    (30 ms each) ahead of ``a_requests`` for a, all with 100 ms SLOs; the first two slow batches planned.
    Returns the policy and the time the second one was planned (everything queued at ``now``)."""
    profiles = {"a": profile("a"), "slow": profile("slow", exec_ms={1: 30.0, 2: 55.0})}
    specs = [DeviceSpec(i, "v100", 100 * PAGE, PAGE) for i in range(1 + idle_devices)]
    policy = ClockworkScheduler(profiles, specs[:1], ClockworkConfig(spill_after=0.5))
    now = 0
    for model in ("a", "slow"):  # both loaded on device 0; the others join afterwards
        policy.on_request(request(100 + len(model), model, now, slo_ms=200), now)
        (load,) = [x for x in policy.schedule(now).actions if isinstance(x, LoadWeights)]
        assert load.device == 0
        policy.on_result(ok(load.action_id, 0, now, now + 5 * MS), now + 5 * MS)
        now += 5 * MS
        (infer,) = infers(policy.schedule(now))
        run_ms = 2 if model == "a" else 30
        policy.on_result(ok(infer.action_id, 0, now, now + run_ms * MS), now + run_ms * MS)
        now += run_ms * MS
    for spec in specs[1:]:
        policy.add_device(spec)
    for i in range(3):  # three slow requests ahead of one for a: device 0 is booked for 90 ms
        policy.on_request(request(i, "slow", now, slo_ms=100), now)
    for i in range(a_requests):
        policy.on_request(request(9 + i, "a", now + 1 * MS, slo_ms=100), now + 1 * MS)
    (first,) = infers(policy.schedule(now + 1 * MS))
    assert first.model == "slow"
    policy.on_result(ok(first.action_id, 0, now + 1 * MS, now + 31 * MS), now + 31 * MS)
    (second,) = infers(policy.schedule(now + 31 * MS))
    assert second.model == "slow" and not any(
        isinstance(x, LoadWeights) for x in policy.schedule(now + 40 * MS).actions
    )
    return policy, now


def test_a_request_stranded_behind_other_models_spills_to_an_idle_device() -> None:
    policy, now = stranded_behind_slow(idle_devices=1)
    # Half their SLO gone, behind a booked lane, the stranded models load on the idle device 1
    # (the most urgent first), so that they may be served there instead of expiring behind slow.
    loads = []
    for t in range(now + 31 * MS, now + 62 * MS, MS):
        for action in policy.schedule(t).actions:
            if isinstance(action, LoadWeights):
                loads.append((action.model, action.device, t - now))
                policy.on_result(ok(action.action_id, 1, t, t + 5 * MS), t + 5 * MS)
    assert [(m, d) for m, d, _ in loads] == [("slow", 1), ("a", 1)]
    assert all(at > 50 * MS for _, _, at in loads)  # not before half the SLO


def loads_planned_every_tenth_ms(policy: ClockworkScheduler, begin: int, end: int) -> list[LoadWeights]:
    """Scheduling passes every 0.1 ms, no result reported (the loads stay in flight)."""
    return [
        action
        for t in range(begin, end, MS // 10)
        for action in policy.schedule(t).actions
        if isinstance(action, LoadWeights)
    ]


def test_a_stranded_model_asks_for_one_replica_at_a_time() -> None:
    # Three idle devices and passes every 0.1 ms while the loads are in flight: each stranded model
    # gets one new replica, not one per pass on every idle device (which evicted five models at once
    # for one resnet152 request on the Azure trace and delayed the loads others were waiting for).
    policy, now = stranded_behind_slow(idle_devices=3)
    loads = loads_planned_every_tenth_ms(policy, now + 31 * MS, now + 60 * MS)
    assert sorted(load.model for load in loads) == ["a", "slow"]


def test_a_stranded_burst_gets_the_replicas_it_needs() -> None:
    # Twelve requests for a: one new replica serves a batch of 8 by the head's deadline, so a second
    # is placed while the first loads (one at a time left a burst of one model to expire).
    policy, now = stranded_behind_slow(idle_devices=3, a_requests=12)
    loads = loads_planned_every_tenth_ms(policy, now + 31 * MS, now + 60 * MS)
    assert sorted(load.model for load in loads) == ["a", "a", "slow"]


def backlog_on_three_holders(behind: int) -> list[Infer]:
    """Model "a" on three idle devices; one request that only a batch of 1 can still serve (2.5 ms
    left), then ``behind`` requests due in 10 ms (a batch of 8 takes 9 ms, of 4 takes 5 ms)."""
    policy = ClockworkScheduler(PROFILES, [], ClockworkConfig())
    for device in range(3):
        policy.add_device(DeviceSpec(device, "v100", 100 * PAGE, PAGE, resident=("a",)))
    now = 100 * MS
    policy.on_request(request(0, "a", now, slo_ms=2.5), now)
    for i in range(1, behind + 1):
        policy.on_request(request(i, "a", now, slo_ms=10), now)
    return infers(policy.schedule(now))


def test_a_backlog_the_holders_cannot_all_take_runs_in_full_batches() -> None:
    # 24 behind the head: after its batch of 1 the holders have room for 4 + 8 + 8 by their deadline.
    # Serving the head would leave that backlog short; three full batches serve 24 of the 25.
    planned = backlog_on_three_holders(24)
    assert sorted(len(i.request_ids) for i in planned) == [8, 8, 8]  # serving the head first: 1 + 4 + 8 + 8
    assert 0 not in {r for i in planned for r in i.request_ids}


def test_a_backlog_the_holders_can_take_lets_the_head_go_first() -> None:
    planned = backlog_on_three_holders(12)  # room for 4 + 8 + 8 after the head: all 13 served
    assert planned[0].request_ids == (0,) and planned[0].batch_size == 1
    assert sum(len(i.request_ids) for i in planned) == 13


def test_admission_s_own_estimates_forget_a_removed_model() -> None:
    """With ``admission_percentile_cpu`` admission plans with its own batch shapes: a model removed
    and added again with other batch sizes is judged by the new ones, as the planner plans it."""
    policy = scheduler(admission_percentile_cpu=50.0)
    assert policy.judged is not policy.shapes
    warm(policy, "a")
    assert policy.judged.sizes("a") == (1, 2, 4, 8)
    policy.remove_model("a", 20 * MS)
    policy.add_model(profile("a", exec_ms={1: 2.0, 2: 3.0}, pages=4))
    assert policy.shapes.sizes("a") == (1, 2)
    assert policy.judged.sizes("a") == (1, 2)


# Batching pays: a batch of 4 costs little more than one request, two little more than one.
EAGER = profile("eager", exec_ms={1: 0.8, 2: 0.9, 4: 1.2, 8: 2.0}, pages=4)


def queue_of_three_after(
    rate_per_ms: int, slo_ms: float = 100, beside: str | None = None, **config: float
) -> tuple[ClockworkScheduler, int]:
    """A model asked ``rate_per_ms`` times a millisecond for 100 ms, served as it comes (its rate
    remembered over 10 ms); then three requests reach its idle lane together (with one of model
    ``beside``, held there too, if given)."""
    spec = DeviceSpec(0, "v100", 100 * PAGE, PAGE)
    policy = ClockworkScheduler({"eager": EAGER, **PROFILES}, [spec], ClockworkConfig(rate_memory_ms=10, **config))  # type: ignore[arg-type]
    now = 0 if beside is None else warm(policy, beside)
    for request_id in range(1, 100 * rate_per_ms + 1):
        policy.on_request(request(request_id, "eager", now), now)
        if request_id % rate_per_ms:
            continue
        for action in policy.schedule(now).actions:  # the load first, then a batch each millisecond
            done = now + action.expected_duration_ns
            policy.on_result(ok(action.action_id, 0, now, done), done)
            policy.schedule(done)
        now += MS
    now = max(now, policy.residency.device(0).exec_lane.free_ns)
    for i in range(3):
        policy.on_request(request(i, "eager", now, slo_ms), now)
    if beside is not None:
        policy.on_request(request(9, beside, now, slo_ms=200), now)
    return policy, now


def test_a_hot_model_s_padded_batch_waits_for_the_request_that_fills_it() -> None:
    # Three requests run as a batch of 4 (1.2 ms, as 2 + 1 would take 1.7), so a fourth would be
    # served in the empty place for nothing: 0.8 ms of lane time saved, and at two a millisecond
    # it is due within them. The lane waits that long for it, no longer.
    policy, now = queue_of_three_after(rate_per_ms=2)
    decisions = policy.schedule(now)
    assert not infers(decisions) and decisions.wakeup_ns == now + 8 * MS // 10
    policy.on_request(request(3, "eager", now + MS // 2), now + MS // 2)
    (batch,) = infers(policy.schedule(now + MS // 2))
    assert batch.batch_size == 4 and batch.request_ids == (0, 1, 2, 3)
    policy, now = queue_of_three_after(rate_per_ms=2)  # nobody comes: the three go at the wake-up
    (batch,) = infers(policy.schedule(now + 8 * MS // 10))
    assert batch.request_ids == (0, 1, 2)


def test_a_batch_runs_at_once_when_waiting_does_not_pay() -> None:
    cases = [
        queue_of_three_after(rate_per_ms=1),  # fewer than one arrival expected within the 0.8 ms
        queue_of_three_after(rate_per_ms=2, slo_ms=1.9),  # 0.8 ms of waiting and 1.2 of batch: too late
        queue_of_three_after(rate_per_ms=2, gather_max_ms=None),  # type: ignore[arg-type]
    ]
    for policy, now in cases:
        assert [len(b.request_ids) for b in infers(policy.schedule(now))] == [3]
    # Another model waiting on the lane: the lane does not idle for "eager", though it is hot.
    policy, now = queue_of_three_after(rate_per_ms=2, beside="a")
    assert [b.model for b in infers(policy.schedule(now))] == ["eager", "a"]
