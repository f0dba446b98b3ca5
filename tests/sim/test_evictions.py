"""Evictions under skewed popularity: the least popular of the least recently used goes first.

Thirty copies of a model share a pool that holds ten, with Zipf popularity (S3 of
``benchmarks/scenarios.py`` in the simulator). Strict LRU evicts a popular model after one gap in
its arrivals and loads it again soon after; the load lane, one load at a time, then delays the
requests of cold models behind those reloads."""

from mainspring.models.profile import model_copies
from mainspring.protocol import CPU_KIND
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.telemetry.report import RunReport
from mainspring.time import NS_PER_S, ms_to_ns
from mainspring.workload import PoissonOpenLoop
from tests.fakes import CPU_RESNET18

POOL_FOR_TEN = 10 * 47 * 2**20


def many_models(rate: float, by_popularity: bool, seed: int) -> RunReport:
    config = SimulationConfig(
        20 * NS_PER_S, 1, CPU_KIND, slo_ns=ms_to_ns(100), seed=seed, pool_bytes=POOL_FOR_TEN, warmup_ns=2 * NS_PER_S
    )
    workload = PoissonOpenLoop(rate, popularity="zipf")
    settings = {"evict_by_popularity": by_popularity}
    return simulate("clockwork", model_copies([CPU_RESNET18], 30), workload, config, settings=settings).report


def test_evicting_the_least_popular_loads_less_and_serves_more() -> None:
    for rate, seed in ((20.0, 1), (40.0, 2)):
        popular, lru = many_models(rate, True, seed), many_models(rate, False, seed)
        assert popular.loads < 0.9 * lru.loads, (rate, popular.loads, lru.loads)
        assert popular.slo_attainment >= lru.slo_attainment, (rate, popular.slo_attainment, lru.slo_attainment)
