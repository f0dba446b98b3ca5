"""``simulate(watch=...)`` shows the recorders as the run goes: the rows so far, growing to the result's."""

from collections.abc import Sequence

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.telemetry.recorder import Recorder
from mainspring.time import NS_PER_S
from mainspring.workload import PoissonOpenLoop


def test_a_watcher_sees_the_rows_so_far_each_simulated_second() -> None:
    seen: list[tuple[int, int, int]] = []

    def watch(now_ns: int, recorders: Sequence[Recorder]) -> None:
        (recorder,) = recorders
        seen.append((now_ns, len(recorder.requests), len(recorder.actions)))

    config = SimulationConfig(duration_ns=3 * NS_PER_S, devices=1, seed=2)
    result = simulate("clockwork", model_copies(builtin_profiles(), 3), PoissonOpenLoop(100.0), config, watch=watch)
    assert [now for now, _, _ in seen[:3]] == [NS_PER_S, 2 * NS_PER_S, 3 * NS_PER_S]
    assert 0 < seen[0][1] < seen[1][1] < seen[2][1] <= len(result.recorder.requests)
    assert seen[-1][2] <= len(result.recorder.actions)
