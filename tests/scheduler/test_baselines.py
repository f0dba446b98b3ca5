"""The reactive baselines, fed by hand (no devices, no clock)."""

from mainspring.protocol import (
    ActionResult,
    ActionStatus,
    DeviceSpec,
    EvictWeights,
    Infer,
    LoadWeights,
    ResponseStatus,
)
from mainspring.scheduler.baselines.clipper import ClipperScheduler
from mainspring.scheduler.baselines.reactive import ReactiveConfig
from mainspring.scheduler.baselines.triton import TritonScheduler
from mainspring.time import NS_PER_MS
from tests.fakes import PAGE, ok, profile, request

MS = NS_PER_MS
PROFILES = {name: profile(name, pages=4) for name in ("a", "b", "c")}


def device(pages: int = 10) -> list[DeviceSpec]:
    return [DeviceSpec(0, "v100", pages * PAGE, PAGE)]


def loaded(policy: TritonScheduler, model: str, now: int) -> int:
    """Ask for ``model`` by a request and finish its load; returns the time after."""
    policy.on_request(request(1000 + now, model, now), now)
    (load,) = policy.schedule(now).actions
    assert isinstance(load, LoadWeights) and load.model == model
    policy.on_result(ok(load.action_id, 0, now, now + 5 * MS), now + 5 * MS)
    return now + 5 * MS


def test_partial_batch_waits_for_the_queue_delay_then_runs_padded() -> None:
    policy = TritonScheduler(PROFILES, device(), ReactiveConfig(max_batch_size=4, max_queue_delay_ms=2))
    policy.on_request(request(1, "a", 0), 0)
    (load,) = policy.schedule(0).actions
    policy.on_request(request(2, "a", 1 * MS), 1 * MS)
    policy.on_request(request(3, "a", 1 * MS), 1 * MS)
    policy.on_result(ok(load.action_id, 0, 0, 1 * MS), 1 * MS)
    decisions = policy.schedule(1 * MS)
    assert decisions.actions == [] and decisions.wakeup_ns == 2 * MS  # oldest arrived at 0
    (infer,) = policy.schedule(2 * MS).actions
    assert isinstance(infer, Infer) and infer.request_ids == (1, 2, 3) and infer.batch_size == 4
    policy.on_result(ok(infer.action_id, 0, 2 * MS, 7 * MS), 7 * MS)
    responses = policy.schedule(7 * MS).responses
    assert [(r.request_id, r.status) for r in responses] == [(i, ResponseStatus.SUCCESS) for i in (1, 2, 3)]


def test_full_batch_runs_at_once_and_one_batch_at_a_time() -> None:
    policy = TritonScheduler(PROFILES, device(), ReactiveConfig(max_batch_size=2, max_queue_delay_ms=50))
    now = loaded(policy, "a", 0)
    assert policy.schedule(now).actions == []  # one request: waits for a second or the delay
    policy.on_request(request(0, "a", now), now)
    (first,) = policy.schedule(now).actions
    assert isinstance(first, Infer) and len(first.request_ids) == 2
    for i in range(1, 4):
        policy.on_request(request(i, "a", now), now)
    assert policy.schedule(now).actions == []  # device busy with the first batch
    policy.on_result(ok(first.action_id, 0, now, now + MS), now + MS)
    (second,) = policy.schedule(now + MS).actions
    assert isinstance(second, Infer) and second.request_ids == (1, 2)


def test_on_demand_load_evicts_the_least_recently_used_idle_model() -> None:
    policy = TritonScheduler(PROFILES, device(pages=8), ReactiveConfig(max_batch_size=1, max_queue_delay_ms=0))
    now = 0
    for model in ("a", "b"):
        now = loaded(policy, model, now)
        (infer,) = policy.schedule(now).actions
        policy.on_result(ok(infer.action_id, 0, now, now + MS), now + MS)
        now += MS
        policy.schedule(now)
    policy.on_request(request(50, "c", now), now)
    evict, load = policy.schedule(now).actions
    assert isinstance(evict, EvictWeights) and evict.model == "a"
    assert isinstance(load, LoadWeights) and load.model == "c"


def test_queue_timeout_drops_requests_that_waited_too_long() -> None:
    policy = TritonScheduler(PROFILES, device(pages=4), ReactiveConfig(queue_timeout_ms=10))
    now = loaded(policy, "a", 0)
    policy.schedule(now)  # "a" runs its first batch
    policy.on_request(request(7, "b", now), now)  # cannot load: "a" is busy, no room
    decisions = policy.schedule(now)
    assert decisions.actions == [] and decisions.wakeup_ns == now + 10 * MS
    timed_out = policy.schedule(now + 10 * MS).responses
    assert [(r.request_id, r.status) for r in timed_out] == [(7, ResponseStatus.TIMED_OUT)]


def test_unknown_model_is_an_error_answer() -> None:
    policy = TritonScheduler(PROFILES, device(), ReactiveConfig())
    policy.on_request(request(1, "nope", 0), 0)
    (response,) = policy.schedule(0).responses
    assert response.status is ResponseStatus.ERROR and "unknown model" in response.reason


def test_refused_batch_goes_back_to_the_queue_in_order() -> None:
    policy = TritonScheduler(PROFILES, device(), ReactiveConfig(max_batch_size=4, max_queue_delay_ms=0))
    now = loaded(policy, "a", 0)
    (infer,) = policy.schedule(now).actions
    policy.on_result(ActionResult(infer.action_id, 0, ActionStatus.TOO_LATE), now)
    (again,) = policy.schedule(now).actions
    assert isinstance(again, Infer) and again.request_ids == infer.request_ids


def test_clipper_grows_additively_and_backs_off_multiplicatively() -> None:
    policy = ClipperScheduler(PROFILES, device(), ReactiveConfig(max_batch_size=8, max_queue_delay_ms=0))
    now = loaded(policy, "a", 0)
    for i in range(40):
        policy.on_request(request(i, "a", now, slo_ms=10), now)
    (infer,) = policy.schedule(now).actions
    sizes = []
    for _ in range(4):
        assert isinstance(infer, Infer)
        sizes.append(len(infer.request_ids))
        policy.on_result(ok(infer.action_id, 0, now, now + MS), now + MS)  # well under the SLO
        now += MS
        (infer,) = policy.schedule(now).actions
    assert sizes == [1, 2, 3, 4]
    assert isinstance(infer, Infer) and len(infer.request_ids) == 5
    policy.on_result(ok(infer.action_id, 0, now, now + 20 * MS), now + 20 * MS)  # over the SLO: back off
    assert policy.batch_limit("a") == 4  # 5 x 0.9 = 4.5, rounded down
