"""Cold loads in order of need (``loads_by_need``): past a saturated load lane, the order of the
latest load start puts the longest load first and serves fewer requests than the order of when each
model's weights must be in place."""

from __future__ import annotations

from mainspring.protocol import DeviceSpec, LoadWeights, ResponseStatus
from mainspring.scheduler.clockwork import ClockworkConfig, ClockworkScheduler
from mainspring.time import NS_PER_MS
from tests.fakes import PAGE, profile, request, run_one_device

MS = NS_PER_MS
# One slow model (a 40 ms load) and three quick ones (10 ms); each runs a batch of one in 2 ms.
PROFILES = {"slow": profile("slow", {1: 2.0}, load_ms=40.0)} | {
    f"quick{i}": profile(f"quick{i}", {1: 2.0}, load_ms=10.0) for i in range(3)
}


def run(loads_by_need: bool) -> tuple[list[str], set[str]]:
    """All four cold at once on one device: the slow model's request may wait 60 ms (its load may start
    until 18 ms), each quick one's 45 ms (until 33 ms). Every action runs exactly as predicted. Returns the
    models in load order and the models whose request was served in time."""
    policy = ClockworkScheduler(
        PROFILES, [DeviceSpec(0, "v100", 100 * PAGE, PAGE)], ClockworkConfig(loads_by_need=loads_by_need)
    )
    models = list(PROFILES)  # request i is to models[i]
    for i, model in enumerate(models):
        policy.on_request(request(i, model, 0, slo_ms=60 if model == "slow" else 45), 0)
    actions, responses = run_one_device(policy, 0, 100 * MS)
    loaded = [a.model for a in actions if isinstance(a, LoadWeights)]
    served = {models[r.request_id] for r in responses if r.status is ResponseStatus.SUCCESS}
    return loaded, served


def test_past_a_saturated_load_lane_the_models_needed_first_load_first() -> None:
    loaded, served = run(loads_by_need=True)
    assert loaded[:3] == ["quick0", "quick1", "quick2"] and served == {"quick0", "quick1", "quick2"}


def test_by_latest_start_the_long_load_goes_first_and_serves_fewer() -> None:
    loaded, served = run(loads_by_need=False)
    assert loaded[0] == "slow" and len(served) < 3
