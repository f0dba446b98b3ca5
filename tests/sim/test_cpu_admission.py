"""Admission at its own percentile on a noisy CPU device (``admission_percentile_cpu``).

Sixteen closed-loop clients that send again 10 ms after a refusal, with two batches of eight in
flight whose p90 estimates together sit at the SLO: judged by those estimates, each client just
answered is refused over and over (every refusal a miss); judged at the median, far fewer are."""

from mainspring.models.profile import ModelProfile
from mainspring.protocol import CPU_KIND
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.telemetry.report import RunReport
from mainspring.time import NS_PER_S, ms_to_ns
from mainspring.worker.runtimes.emulated import NoiseModel
from mainspring.workload import ClosedLoop

# resnet18 (64x64) on one thread of this machine's CPU; a tail like a CPU that shares its cores
CPU_MODEL = ModelProfile(
    "resnet18",
    CPU_KIND,
    46_796_608,
    ms_to_ns(36),
    {1: ms_to_ns(9.8), 2: ms_to_ns(16.6), 4: ms_to_ns(23.5), 8: ms_to_ns(40.3)},
)
SHARED_CPU = NoiseModel(jitter_sigma=0.15, spike_probability=0.05, spike_min_factor=1.5, spike_max_factor=3.5)


def closed_loop(settings: dict[str, object] | None) -> RunReport:
    config = SimulationConfig(10 * NS_PER_S, 1, CPU_KIND, slo_ns=ms_to_ns(102), seed=1, noise=SHARED_CPU)
    return simulate("clockwork", [CPU_MODEL], ClosedLoop(16), config, settings=settings).report


def test_admission_at_the_median_stops_refusing_what_the_p90_sum_refuses() -> None:
    planned = closed_loop(None)
    judged = closed_loop({"admission_percentile_cpu": 50.0})
    assert judged.rejected * 2 < planned.rejected
    assert judged.slo_attainment > planned.slo_attainment + 0.1
    assert judged.goodput_rps >= 0.95 * planned.goodput_rps  # the lane serves as much
