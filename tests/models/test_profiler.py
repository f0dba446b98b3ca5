"""``mainspring profile`` measures through the worker and feeds ``mainspring simulate``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mainspring.cli import main
from mainspring.models.repository import ModelRepository
from mainspring.protocol.pages import MIB


def test_profile_writes_profiles_the_simulator_reads(
    small_zoo: ModelRepository, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "repo"
    shutil.copytree(small_zoo.root, root)
    assert (
        main(["profile", str(root), "--model", "mlp", "--model", "bert_tiny", "--max-seconds", "0.3", "--quiet"]) == 0
    )
    table = capsys.readouterr().out
    assert "mlp" in table and "bert_tiny" in table and "exec p50/p99" in table
    repo = ModelRepository(root)
    profile = repo.profile("mlp", "cpu")
    assert profile is not None and repo.profile("resnet18", "cpu") is None
    assert set(profile.exec_ns) == {1, 2, 4, 8} and profile.load_ns > 0
    assert all(0 < ns < 1e9 for ns in profile.exec_ns.values())
    assert profile.pages(16 * MIB) == 1 and profile.weights_bytes > 1_500_000
    args = ["simulate", "--profiles", str(root), "--models", "20", "--devices", "1", "--duration-s", "5"]
    assert main([*args, "--workload", "poisson", "--rate", "50", "--quiet"]) == 0
    assert "SLO attainment" in capsys.readouterr().out


def test_profile_of_an_empty_repository_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", str(tmp_path)])
    assert exit_info.value.code == 2 and "holds no models" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model", "nope"], "--model nope: not in "),
        (["--model", "mlp", "--max-runs", "0"], "argument --max-runs: must be an integer in [1, 1000000], got '0'"),
        (["--model", "mlp", "--max-seconds", "-1"], "argument --max-seconds: must be a finite number in (0, 3600]"),
        (["--model", "mlp", "--device", "cuda:9"], "device 'cuda:9' is not on this machine"),
    ],
)
def test_bad_profile_flags_are_refused_before_any_measurement(
    small_zoo: ModelRepository, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {path: path.stat().st_mtime_ns for path in small_zoo.root.rglob("*")}
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", str(small_zoo.root), "--quiet", *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert {path: path.stat().st_mtime_ns for path in small_zoo.root.rglob("*")} == before  # nothing written
