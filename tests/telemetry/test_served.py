"""``mainspring profile REPO --from-log DIR``: stored profiles recalibrated to a served run's medians."""

from __future__ import annotations

from pathlib import Path

import pytest

from mainspring.cli import main
from mainspring.models.loading import export_zoo_model
from mainspring.models.profile import ModelProfile
from mainspring.models.repository import ModelRepository
from mainspring.protocol import CPU_KIND
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import NS_PER_S, ms_to_ns
from mainspring.worker.runtimes.emulated import NoiseModel
from mainspring.workload import PoissonOpenLoop

SLOWER = 1.25  # every served duration, against the profile


def served_run(tmp_path: Path) -> tuple[ModelRepository, ModelProfile, Path]:
    """A repository holding mlp with a CPU profile, and the logs of a run where every action took 1.25x."""
    (tmp_path / "repo").mkdir()
    repo = ModelRepository(tmp_path / "repo")
    export_zoo_model(repo, "mlp")
    quiet = ModelProfile("mlp", CPU_KIND, 4 * 2**20, ms_to_ns(2), {1: ms_to_ns(4), 2: ms_to_ns(5), 64: ms_to_ns(40)})
    repo.write_profile(quiet)
    slower = NoiseModel(jitter_sigma=0.0, spike_probability=1.0, spike_min_factor=SLOWER, spike_max_factor=SLOWER)
    config = SimulationConfig(duration_ns=3 * NS_PER_S, devices=1, device_kind=CPU_KIND, noise=slower, seed=4)
    result = simulate("clockwork", [quiet], PoissonOpenLoop(150.0), config)
    logs = tmp_path / "logs"
    result.recorder.write_logs(logs, "served")
    return repo, quiet, logs


def test_profiles_take_the_served_medians_and_scale_what_the_run_never_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, quiet, logs = served_run(tmp_path)
    assert main(["profile", str(repo.root), "--from-log", str(logs)]) == 0
    (served,) = repo.all_profiles()
    for size in (1, 2):  # run often at 150 r/s: their medians, 1.25x
        assert served.exec_ns[size] == pytest.approx(SLOWER * quiet.exec_ns[size], rel=1e-6)
    assert served.exec_ns[64] == pytest.approx(SLOWER * quiet.exec_ns[64], rel=1e-6)  # never run: scaled alike
    assert served.load_ns == pytest.approx(SLOWER * quiet.load_ns, rel=1e-6)  # one load: scaled alike
    assert served.weights_bytes == quiet.weights_bytes and served.device_kind == CPU_KIND
    assert "1 profile(s) recalibrated to run served (served 1.25x the profiled times)" in capsys.readouterr().out


def test_a_log_the_profiles_do_not_match_gets_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo, _, logs = served_run(tmp_path)
    for argv, expected in (
        (["--from-log", str(tmp_path / "nowhere")], "no run logs"),
        (["--from-log", str(logs), "--run", "other"], "--run other: not in"),
        (["--run", "served"], "give --from-log too"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(["profile", str(repo.root), *argv])
        assert exited.value.code == 2
        assert expected in capsys.readouterr().err
