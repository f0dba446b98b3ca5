"""A simulation collects cycles less often while it runs, and leaves the caller's settings as they were."""

import gc

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.sim.collector import YOUNG_THRESHOLD
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import NS_PER_S
from mainspring.workload import PoissonOpenLoop


def test_a_simulation_raises_the_young_threshold_only_while_it_runs() -> None:
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []
    try:
        gc.set_threshold(700, 7, 9)
        config = SimulationConfig(duration_ns=2 * NS_PER_S, devices=1, seed=2)
        result = simulate(
            "clockwork",
            model_copies(builtin_profiles(), 5),
            PoissonOpenLoop(100.0),
            config,
            progress=lambda _now: seen.append(gc.get_threshold()),
        )
        assert result.report.requests > 100
        assert seen and all(t == (YOUNG_THRESHOLD, 7, 9) for t in seen)  # the older generations kept
        assert gc.get_threshold() == (700, 7, 9)
    finally:
        gc.set_threshold(*before)
