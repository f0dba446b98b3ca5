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


def rewrite_actions(logs: Path, keep: int | None, **columns: str) -> None:
    """The run's action log cut to its first ``keep`` infers (None: all), each with ``columns`` set."""
    lines = (logs / "served-actions.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    rows = [line.split("\t") for line in lines[1:]]
    infers = [r for r in rows if r[header.index("kind")] == "infer"][:keep]
    for row in infers:
        for name, value in columns.items():
            row[header.index(name)] = value
    (logs / "served-actions.tsv").write_text("\n".join("\t".join(r) for r in [header, *infers]) + "\n")


@pytest.mark.parametrize(
    ("keep", "columns", "expected"),
    [
        # one infer of 1 ns made every mlp time 1e-6 ms
        (1, {"begin_ns": "0", "end_ns": "1"}, "1 successful infer(s) of a profiled model and batch size; at least 5"),
        # an end_ns of 1e28 made them about 1e23 ms
        (None, {"end_ns": "10000000000000000000000000000"}, "more than an action can (an hour)"),
        (None, {"end_ns": "1e28"}, "end_ns '1e28' must be integers (ns)"),
        (None, {"end_ns": "nan"}, "must be integers (ns)"),
        (None, {"begin_ns": "9000000", "end_ns": "10"}, "ends before it begins (begin_ns 9000000, end_ns 10)"),
        (None, {"batch_size": "1e3"}, "(mlp): batch_size '1e3' is not a batch size"),
        # every infer 100 ms against a profile of 4-40 ms: the run's slowdown is out of bounds
        (None, {"begin_ns": "0", "end_ns": "400000000"}, "outside 0.2-10x: not these models on this device"),
    ],
)
def test_an_implausible_log_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keep: int | None, columns: dict[str, str], expected: str
) -> None:
    repo, quiet, logs = served_run(tmp_path)
    rewrite_actions(logs, keep, **columns)
    with pytest.raises(SystemExit) as exited:
        main(["profile", str(repo.root), "--from-log", str(logs)])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert expected in error and error.count("\n") == 1 and "Traceback" not in error
    assert repo.all_profiles() == [quiet]  # the stored profile is untouched


def test_one_batch_size_far_from_its_profile_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Batch 2's infers 50x their profile, batch 1's (most of them) as served: the run's slowdown looks fine."""
    repo, quiet, logs = served_run(tmp_path)
    lines = (logs / "served-actions.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    column = {name: header.index(name) for name in ("kind", "batch_size", "begin_ns", "end_ns")}
    rows = [line.split("\t") for line in lines[1:]]
    for row in rows:
        if row[column["kind"]] == "infer" and row[column["batch_size"]] == "2":
            row[column["end_ns"]] = str(int(row[column["begin_ns"]]) + 50 * quiet.exec_ns[2])
    ones = sum(1 for r in rows if r[column["kind"]] == "infer" and r[column["batch_size"]] == "1")
    twos = sum(1 for r in rows if r[column["kind"]] == "infer" and r[column["batch_size"]] == "2")
    assert 5 <= twos < ones  # batch 2 is the minority, so the median ratio stays near 1.25
    (logs / "served-actions.tsv").write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")
    with pytest.raises(SystemExit):
        main(["profile", str(repo.root), "--from-log", str(logs)])
    assert "model mlp, batch 2: the served median 250 ms is 50x its profiled 5 ms" in capsys.readouterr().err
    assert repo.all_profiles() == [quiet]
