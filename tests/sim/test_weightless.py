"""The simulator serves models without weights as the live server does: resident on every device from
the start, with no load, beside models that cycle through a small pool."""

import pytest

from mainspring.models.profile import ModelProfile, model_copies
from mainspring.protocol import CPU_KIND
from mainspring.sim.plan import plan
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import NS_PER_S, ms_to_ns
from mainspring.workload import PoissonOpenLoop
from tests.fakes import CPU_RESNET18

# Triton's ``simple`` (sum and difference of two INT32 vectors): nothing to page
SIMPLE = ModelProfile("simple", CPU_KIND, 0, 1, {1: ms_to_ns(0.2), 2: ms_to_ns(0.25), 4: ms_to_ns(0.3)})


@pytest.mark.parametrize("policy", ["clockwork", "infer4", "infer5", "triton", "clipper"])
def test_models_without_weights_are_never_loaded(policy: str) -> None:
    config = SimulationConfig(4 * NS_PER_S, 1, CPU_KIND, slo_ns=ms_to_ns(100), seed=3, pool_bytes=3 * 47 * 2**20)
    alone = simulate(policy, model_copies([SIMPLE], 20), PoissonOpenLoop(200.0), config).report
    assert alone.loads == 0 and alone.errors == 0 and alone.slo_attainment == 1.0
    mixed = simulate(policy, model_copies([SIMPLE, CPU_RESNET18], 20), PoissonOpenLoop(60.0), config).report
    assert mixed.errors == 0 and mixed.loads > 0  # the resnets cycle through the pool; nothing fails beside them


def test_a_plan_for_models_without_weights_needs_a_pool_of_one_page() -> None:
    config = SimulationConfig(2 * NS_PER_S, 1, CPU_KIND, slo_ns=ms_to_ns(50), seed=1, pool_bytes=2**30)
    found = plan(model_copies([SIMPLE], 50), PoissonOpenLoop(500.0), config, 0.999, max_devices=4)
    assert found.devices == 1 and found.pool_bytes == config.page_bytes
