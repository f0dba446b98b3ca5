"""benchmarks/live_vs_sim.py reads a logged run back into profiles, noise and arrivals; checked on
a simulated run's logs, whose true batch times and noise are known."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from live_vs_sim import arrivals_of, fitted_noise, measured_profiles
from mainspring.protocol import CPU_KIND
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.telemetry.analyze import read_run
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.worker.runtimes.emulated import NoiseModel
from mainspring.workload import PoissonOpenLoop
from tests.fakes import CPU_RESNET18


def logged_run(tmp_path: Path, noise: NoiseModel) -> tuple[float, Path]:
    config = SimulationConfig(duration_ns=s_to_ns(5), devices=1, device_kind=CPU_KIND, slo_ns=ms_to_ns(60), noise=noise)
    result = simulate("clockwork", [CPU_RESNET18], PoissonOpenLoop(150.0), config)
    result.recorder.write_logs(tmp_path, "run")
    return result.report.slo_attainment, tmp_path


def test_a_run_without_noise_reads_back_as_its_profile_and_replays_to_its_attainment(tmp_path: Path) -> None:
    attainment, directory = logged_run(tmp_path, NoiseModel.exact())
    requests, actions = read_run(directory, "run")
    (profile,) = measured_profiles(actions, CPU_RESNET18.weights_bytes).values()
    assert profile.load_ns == CPU_RESNET18.load_ns
    assert profile.exec_ns == {size: CPU_RESNET18.exec_ns[size] for size in profile.exec_ns}  # the sizes it ran
    noise = fitted_noise(actions, {profile.model: profile})
    assert noise.jitter_sigma == pytest.approx(0, abs=1e-9) and noise.spike_probability == 0
    arrivals = arrivals_of(requests)
    assert len(arrivals) == len(requests) and arrivals[0].time_ns == 0
    assert {a.slo_ns for a in arrivals} == {ms_to_ns(60)}
    config = SimulationConfig(duration_ns=arrivals[-1].time_ns + 1, devices=1, device_kind=CPU_KIND,
                              noise=NoiseModel.exact())  # fmt: skip
    replay = simulate("clockwork", [CPU_RESNET18], PoissonOpenLoop(1.0), config, arrivals).report
    assert replay.requests == len(requests) and replay.slo_attainment == pytest.approx(attainment, abs=0.01)


def test_the_noise_of_a_noisy_run_is_found_again(tmp_path: Path) -> None:
    true = NoiseModel(jitter_sigma=0.1, spike_probability=0.05, spike_min_factor=2.0, spike_max_factor=3.0)
    _, directory = logged_run(tmp_path, true)
    _, actions = read_run(directory, "run")
    profiles = measured_profiles(actions, CPU_RESNET18.weights_bytes)
    for size, median in next(iter(profiles.values())).exec_ns.items():
        assert median == pytest.approx(CPU_RESNET18.exec_ns[size], rel=0.1)
    noise = fitted_noise(actions, profiles)
    assert noise.jitter_sigma == pytest.approx(0.1, abs=0.03)
    assert noise.spike_probability == pytest.approx(0.05, abs=0.025)
    assert 2.0 < noise.spike_max_factor <= 3.5
