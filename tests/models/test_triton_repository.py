"""Triton model repositories as they are: ``config.pbtxt`` read through tritonclient's model-config
definitions; what cannot be honoured is refused naming the field, and the rest is served."""

from __future__ import annotations

from pathlib import Path

import pytest

from mainspring.models.errors import ModelLoadError
from mainspring.models.repository import ModelRepository
from tests.onnx_models import build_triton_repo


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    return build_triton_repo(Path(tmp_path_factory.mktemp("triton")) / "repo")


def test_supported_configs_become_model_configs(triton_repo: ModelRepository) -> None:
    mlp = triton_repo.config("onnx_mlp")
    assert (mlp.format, mlp.file, mlp.batch_sizes) == ("onnx", "model.onnx", (1, 2, 4, 8))  # preferred 2, 4; max 8
    assert [(t.name, t.datatype, t.shape) for t in (*mlp.inputs, *mlp.outputs)] == [
        ("x", "FP32", (-1, 16)),
        ("y", "FP32", (-1, 4)),
    ]
    assert mlp.outputs[0].labels == ("cat", "dog", "bird", "fish")  # label_filename, for classification
    fixed = triton_repo.config("onnx_fixed")  # no name (the folder's), backend, default_model_filename
    assert (fixed.name, fixed.file, fixed.batch_sizes) == ("onnx_fixed", "fixed.onnx", (1,))  # the graph fixes 1
    torch_mlp = triton_repo.config("torch_mlp")
    assert (torch_mlp.format, torch_mlp.batch_sizes) == ("torchscript", (1, 2, 4))
    assert triton_repo.latest_version("torch_mlp") == 2 and triton_repo.versions("torch_mlp") == [1, 2]
    assert triton_repo.model_file("torch_mlp") == triton_repo.root / "torch_mlp" / "2" / "model.pt"


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("ensemble_model", "platform ensemble"),
        ("python_model", "backend python"),
        ("sequence_model", "sequence_batching"),
        ("tf_model", "'tensorflow_savedmodel' is not supported"),
        ("string_input", "data_type TYPE_STRING"),
        ("bad_dims", "dims [3, 16] with max_batch_size 0"),
        ("two_versions", "version_policy all"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_field(
    triton_repo: ModelRepository, model: str, field: str
) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.pbtxt") as refused:
        triton_repo.config(model) if model != "two_versions" else triton_repo.latest_version(model)
    assert field in str(refused.value)


def test_a_malformed_config_names_the_file_and_the_line(tmp_path: Path) -> None:
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "config.pbtxt").write_text('name: "broken"\nmax_batch_size: "eight"\n')
    with pytest.raises(ModelLoadError, match=r"broken/config.pbtxt: 2:"):
        ModelRepository(tmp_path).config("broken")


def test_both_layouts_sit_in_one_repository(triton_repo: ModelRepository, small_zoo: ModelRepository) -> None:
    import shutil

    mixed = Path(triton_repo.root).parent / "mixed"
    shutil.copytree(small_zoo.root / "mlp", mixed / "mlp")
    shutil.copytree(triton_repo.root / "onnx_mlp", mixed / "onnx_mlp")
    repo = ModelRepository(mixed)
    assert repo.models() == ["mlp", "onnx_mlp"]
    assert repo.config("mlp").format == "torch_export" and repo.config("onnx_mlp").format == "onnx"


def test_mainspring_profile_measures_a_triton_repository(triton_repo: ModelRepository) -> None:
    from mainspring.cli import main

    assert main(["profile", str(triton_repo.root), "--model", "onnx_mlp"]) == 0
    (profile,) = triton_repo.profiles("onnx_mlp")
    assert profile.device_kind == "cpu" and set(profile.exec_ns) == {1, 2, 4, 8}
    assert (triton_repo.root / "onnx_mlp" / "1" / "profile.json").is_file()


def test_a_label_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "repo" / "labelled"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "missing.txt" } ]\n'
    )
    with pytest.raises(ModelLoadError, match=r"output 'y': cannot read label_filename 'missing\.txt'"):
        ModelRepository(tmp_path / "repo").config("labelled")
