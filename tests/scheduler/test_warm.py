"""A cell taking a model over loads it before its requests come (``ClockworkScheduler.warm``)."""

from __future__ import annotations

from mainspring.protocol import DeviceSpec, LoadWeights
from mainspring.scheduler.clockwork.policy import ClockworkScheduler
from tests.fakes import PAGE, ok, profile


def test_a_warmed_model_is_loaded_with_no_request_and_only_once() -> None:
    devices = [DeviceSpec(0, "v100", 64 * PAGE, PAGE), DeviceSpec(1, "v100", 64 * PAGE, PAGE)]
    policy = ClockworkScheduler({"m": profile("m"), "n": profile("n")}, devices)
    assert policy.schedule(0).actions == []  # nothing asked, nothing loaded
    assert policy.warm("m") is True
    loads = [a for a in policy.schedule(0).actions if isinstance(a, LoadWeights)]
    assert [a.model for a in loads] == ["m"]
    assert policy.warm("m") is False  # on its way: not twice
    load = loads[0]
    policy.on_result(ok(load.action_id, load.device, 0, load.expected_duration_ns), load.expected_duration_ns)
    assert policy.warm("m") is False and policy.warm("unknown") is False
    assert not [a for a in policy.schedule(load.expected_duration_ns).actions if isinstance(a, LoadWeights)]
