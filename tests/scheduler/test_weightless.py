"""Models without weights (Triton's ``simple``: all they need is in their graph) take no pages, are never
loaded or evicted, and are served on every device from the start, in every policy."""

from __future__ import annotations

import pytest

from mainspring.protocol import DeviceSpec, EvictWeights, LoadWeights, ResponseStatus
from tests.fakes import PAGE, profile, request
from tests.scheduler.test_membership import Harness, spec

MS = 1_000_000
POLICIES = ["clockwork", "infer4", "infer5", "triton", "clipper"]


def test_a_profile_without_weights_takes_no_pages() -> None:
    weightless = profile("w", pages=0)
    assert weightless.weightless and weightless.pages(PAGE) == 0
    assert not profile("a").weightless


def _loads_and_evictions(h: Harness, model: str) -> list[str]:
    return [type(a).__name__ for a in h.sent if isinstance(a, LoadWeights | EvictWeights) and a.model == model]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_model_without_weights_is_served_without_a_load_beside_models_that_cycle(policy: str) -> None:
    # One device whose pool holds one of "a" and "b" (2 pages each): they evict each other, "w" stays.
    h = Harness(policy, [0])
    h.members.remove_device(0, 0)
    h.members.add_model(profile("w", pages=0))
    h.members.add_device(DeviceSpec(1, "v100", 3 * PAGE, PAGE))
    for i, model in enumerate(["w", "a", "w", "b", "w", "a", "w"]):
        h.policy.on_request(request(i, model, h.now, slo_ms=500), h.now)
        h.run_until_quiet(h.now + 400 * MS)
        assert h.answers[i].status is ResponseStatus.SUCCESS, (model, h.answers[i])
    assert _loads_and_evictions(h, "w") == []
    assert "EvictWeights" in [type(a).__name__ for a in h.sent], "the test must make the others cycle"


@pytest.mark.parametrize("policy", POLICIES)
def test_a_model_without_weights_added_while_serving_is_resident_on_every_device(policy: str) -> None:
    h = Harness(policy, [0, 1])
    h.members.add_model(profile("w", pages=0))
    h.members.add_device(spec(2))  # and on a device that joins later
    h.members.remove_device(0, 0)
    h.members.remove_device(1, 0)
    for i in range(4):
        h.policy.on_request(request(i, "w", h.now, slo_ms=500), h.now)
        h.run_until_quiet(h.now + 100 * MS)
    assert all(h.answers[i].status is ResponseStatus.SUCCESS for i in range(4))
    assert _loads_and_evictions(h, "w") == []
    assert {a.device for a in h.sent} == {2}
