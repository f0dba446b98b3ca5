"""The model repository: configs, versions, profiles, and clear errors for what is wrong on disk."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from mainspring.models.errors import ModelLoadError
from mainspring.models.profile import ModelProfile
from mainspring.models.repository import ModelRepository
from mainspring.protocol.models import ModelConfig
from mainspring.protocol.tensors import TensorSpec

IMAGE = (TensorSpec("input", "FP32", (-1, 3, 8, 8)),)
LOGITS = (TensorSpec("logits", "FP32", (-1, 10)),)


def config(name: str = "m", **changes: object) -> ModelConfig:
    fields: dict[str, object] = {"name": name, "format": "torch_export", "file": "model.pt2"}
    fields |= {"inputs": IMAGE, "outputs": LOGITS} | changes
    return ModelConfig(**fields)  # type: ignore[arg-type]


def test_round_trip_and_the_latest_version_is_served(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    repo.write(config(batch_sizes=(1, 2)), version=1)
    repo.write(config(batch_sizes=(1, 4, 8)), version=3)
    (tmp_path / "m" / "notes").mkdir()
    (tmp_path / "empty").mkdir()
    assert repo.models() == ["m"] and repo.versions("m") == [1, 3]
    assert repo.config("m").batch_sizes == (1, 4, 8) and repo.config("m", 1).batch_sizes == (1, 2)
    assert repo.config("m").inputs == IMAGE


def test_a_config_json_may_name_the_classes_of_an_output(tmp_path: Path) -> None:
    labelled = (TensorSpec("logits", "FP32", (-1, 3), labels=("cat", "dog", "bird")),)
    ModelRepository(tmp_path).write(config(outputs=labelled), version=1)
    written = json.loads((tmp_path / "m" / "1" / "config.json").read_text())
    assert written["outputs"][0]["labels"] == ["cat", "dog", "bird"]
    assert ModelRepository(tmp_path).config("m").outputs[0].labels == ("cat", "dog", "bird")
    assert "labels" not in json.dumps(msgspec.to_builtins(config()))  # none: nothing written


def test_profiles_are_kept_per_device_kind(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    repo.write(config())
    cpu = ModelProfile("m", "cpu", 1000, 5, {1: 10})
    repo.write_profile(cpu)
    repo.write_profile(ModelProfile("m", "nvidia-h200", 1000, 1, {1: 2}))
    repo.write_profile(ModelProfile("m", "cpu", 1000, 6, {1: 11}))
    assert repo.profile("m", "cpu") == ModelProfile("m", "cpu", 1000, 6, {1: 11})
    assert {p.device_kind for p in repo.all_profiles()} == {"cpu", "nvidia-h200"}
    assert [p.load_ns for p in repo.all_profiles("cpu")] == [6]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "pickle"}, "format 'pickle'"),
        ({"batch_sizes": (4, 2)}, "increasing"),
        ({"inputs": (TensorSpec("x", "FP32", (1, 3)),)}, r"batch\) dimension must be -1"),
        ({"format": "safetensors"}, "needs an 'architecture'"),
        ({"runtime": "tensorrt"}, "runtime 'tensorrt'"),
        ({"slo_ms": 1e300}, r"slo_ms must be at most 86400000 \(one day\), got 1e\+300"),
    ],
)
def test_bad_configs_are_refused_with_the_reason(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(**change)


def test_bad_files_give_errors_naming_the_file(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    folder = repo.write(config())
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"bad config .*m/1/config.json"):
        repo.config("m")
    (folder / "config.json").write_text(json.dumps({"name": "m", "format": "torch_export", "file": "x"}))
    with pytest.raises(ModelLoadError, match="inputs"):
        repo.config("m")
    (folder / "config.json").write_text(
        json.dumps(
            {
                "name": "other",
                "format": "torch_export",
                "file": "x",
                "inputs": [{"name": "i", "datatype": "FP32", "shape": [-1, 2]}],
                "outputs": [{"name": "o", "datatype": "FP32", "shape": [-1, 1]}],
            }
        )
    )
    with pytest.raises(ModelLoadError, match="does not match its folder"):
        repo.config("m")
    with pytest.raises(ModelLoadError, match="not in repository"):
        repo.config("absent")
    with pytest.raises(ModelLoadError, match="is not a folder"):
        ModelRepository(tmp_path / "missing")


def test_tensor_specs_check_one_sample() -> None:
    import numpy as np

    spec = TensorSpec("input", "FP32", (-1, 3, -1))
    spec.check_sample(np.zeros((1, 3, 7), np.float32), "x")
    with pytest.raises(ValueError, match=r"x: shape \[2, 3, 7\] does not match \[1, 3, -1\]"):
        spec.check_sample(np.zeros((2, 3, 7), np.float32), "x")
    with pytest.raises(ValueError, match="datatype INT64 does not match FP32"):
        spec.check_sample(np.zeros((1, 3, 7), np.int64), "x")
    with pytest.raises(ValueError, match="unknown datatype 'FLOAT'"):
        TensorSpec("y", "FLOAT", (-1,))


@pytest.mark.parametrize("name", ["..", "../m", "m/1", "/etc", ".hidden", "", "a" * 129, "m\x00"])
def test_a_name_is_one_plain_path_component(tmp_path: Path, name: str) -> None:
    repo = ModelRepository(tmp_path)
    with pytest.raises(ModelLoadError, match="not a plain name"):
        repo.config(name)


def test_nothing_a_link_names_outside_the_repository_is_listed_or_read(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "repo").mkdir()
    outside = ModelRepository(tmp_path / "outside")
    outside.write(config("escape"))
    outside.write(config("m"))
    repo = ModelRepository(tmp_path / "repo")
    repo.write(config("m"))
    (repo.root / "escape").symlink_to(outside.root / "escape")  # a model folder that leads out
    (repo.root / "m" / "2").symlink_to(outside.root / "m" / "1")  # a version folder that leads out
    assert repo.models() == ["m"] and repo.versions("m") == [1]
    with pytest.raises(ModelLoadError, match="outside the repository"):
        repo.config("escape")
    (outside.root / "m" / "1" / "model.pt2").write_bytes(b"secret")
    (repo.root / "m" / "1" / "model.pt2").symlink_to(outside.root / "m" / "1" / "model.pt2")
    with pytest.raises(ModelLoadError, match="outside the repository"):
        repo.model_file("m")


@pytest.mark.parametrize("file", ["../model.pt2", "/etc/passwd", "sub/model.pt2", ".."])
def test_the_model_file_is_a_name_in_the_version_folder(file: str) -> None:
    with pytest.raises(ValueError, match="not a path"):
        config(file=file)
