"""The replica rule by wait (``replicas_by_wait``): requests that a model's holders turn away for their
deadline, while a device without the model had its lane free in time for them, earn the model a
replica there; fed by hand, as ``test_clockwork.py``."""

from mainspring.protocol import DeviceSpec, LoadWeights, Outcome
from mainspring.scheduler.clockwork import ClockworkConfig, ClockworkScheduler
from tests.fakes import PAGE, request
from tests.scheduler.test_clockwork import MS, PROFILES, infers


def turned_away(
    turned: int, by_wait: bool = True, other_busy: bool = False, other_pages: int = 100
) -> tuple[ClockworkScheduler, list[LoadWeights]]:
    """Device 0 holds "a" and "b"; device 1 holds "c" (``other_pages`` pages in all, four taken by c).
    Eight b requests book device 0 for 9 ms (and, with ``other_busy``, eight c requests device 1);
    then ``turned`` requests for a with a 4 ms SLO arrive, 0.5 ms apart: device 0 cannot finish
    them in time, nor can a load (5 ms). Returns the policy and the loads planned in the next 20 ms."""
    specs = [
        DeviceSpec(0, "v100", 100 * PAGE, PAGE, resident=("a", "b")),
        DeviceSpec(1, "v100", other_pages * PAGE, PAGE, resident=("c",)),
    ]
    policy = ClockworkScheduler(PROFILES, [], ClockworkConfig(replicas_by_wait=by_wait))
    for spec in specs:
        policy.add_device(spec)
    now = 100 * MS
    for i in range(8):
        policy.on_request(request(i, "b", now), now)
        if other_busy:
            policy.on_request(request(20 + i, "c", now), now)
    assert {i.batch_size for i in infers(policy.schedule(now))} == {8}
    for i in range(turned):
        at = now + MS + i * MS // 2
        policy.on_request(request(100 + i, "a", at, slo_ms=4), at)
    later = now + 2 * MS + turned * MS // 2
    loads, refused = [], []
    for t in range(later, later + 20 * MS, MS):
        decisions = policy.schedule(t)
        loads += [action for action in decisions.actions if isinstance(action, LoadWeights)]
        refused += [r for r in decisions.responses if r.outcome is Outcome.DEADLINE_AT_ARRIVAL]
    assert len(refused) == turned
    return policy, loads


def test_requests_turned_away_while_another_lane_was_free_earn_a_replica_there() -> None:
    _, loads = turned_away(3)
    assert [(load.model, load.device) for load in loads] == [("a", 1)]
    # Without the rule: demand beyond what the holders serve is all that asks for a replica, and
    # three requests ask for little.
    _, loads = turned_away(3, by_wait=False)
    assert loads == []


def test_one_request_turned_away_is_not_enough() -> None:
    _, loads = turned_away(1)  # fewer than ``replica_min_waits_per_s`` (2) a second
    assert loads == []


def test_no_replica_where_no_other_device_had_time() -> None:
    _, loads = turned_away(3, other_busy=True)  # device 1 booked with c's batch of 8: 9 ms
    assert loads == []


def test_a_replica_by_wait_takes_only_free_memory() -> None:
    # Device 1 has room for c alone: a replica of a would evict it, and the rule never evicts.
    _, loads = turned_away(3, other_pages=4)
    assert loads == []
