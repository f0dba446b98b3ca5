"""The built-in zoo: architectures as published, exported as real files that load back identical."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mainspring.cli import main
from mainspring.models.loading import export_zoo_model, load_module
from mainspring.models.repository import ModelRepository
from mainspring.models.zoo import build_model, example_inputs


@pytest.mark.parametrize(
    ("name", "params"), [("resnet18", 11_689_512), ("resnet50", 25_557_032), ("mobilenetv2", 3_504_872)]
)
def test_vision_models_have_torchvisions_parameter_counts(name: str, params: int) -> None:
    assert sum(p.numel() for p in build_model(name).parameters()) == params


def test_weights_are_seeded() -> None:
    a, b, c = build_model("mlp", seed=1), build_model("mlp", seed=1), build_model("mlp", seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(a.state_dict()["body.0.weight"], c.state_dict()["body.0.weight"])


@pytest.mark.parametrize("fmt", ["torch_export", "torchscript", "safetensors", "onnx"])
@pytest.mark.parametrize("name", ["mobilenetv2", "bert_tiny"])
def test_every_format_loads_back_to_the_same_function(tmp_path: Path, fmt: str, name: str) -> None:
    repo = ModelRepository(tmp_path)
    args = {"image_size": 32} if name == "mobilenetv2" else {}
    config = export_zoo_model(repo, name, fmt=fmt, args=args)
    loaded_config, module = load_module(repo, name)
    assert loaded_config == config
    reference = build_model(name, args)
    for batch in config.batch_sizes:
        inputs = example_inputs(config.inputs, batch, seed=batch)
        with torch.inference_mode():
            got = module(*inputs)
            got = got[0] if fmt == "onnx" else got  # ONNX Runtime answers every output, in a tuple
            torch.testing.assert_close(got, reference(*inputs), rtol=1e-4, atol=1e-5)


def test_zoo_export_writes_copies_as_model_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "repo"
    assert main(["zoo", "export", "--out", str(out), "--models", "mlp", "--copies", "3", "--batch-sizes", "1,4"]) == 0
    repo = ModelRepository(out)
    assert repo.models() == ["mlp-0", "mlp-1", "mlp-2"]
    for model in repo.models():
        assert repo.config(model).batch_sizes == (1, 4)
        assert (repo.path(model) / "model.pt2").stat().st_size > 1_000_000
    assert "mlp: 3 model(s)" in capsys.readouterr().out


def test_zoo_export_rejects_unknown_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["zoo", "export", "--out", str(tmp_path), "--models", "vgg16"])
    assert exit_info.value.code == 2 and "vgg16" in capsys.readouterr().err


def test_zoo_export_to_a_file_is_refused_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "taken").write_text("not a repository")
    with pytest.raises(SystemExit) as exit_info:
        main(["zoo", "export", "--out", str(tmp_path / "taken"), "--models", "mlp"])
    assert exit_info.value.code == 2
    assert f"--out {tmp_path / 'taken'}: cannot write there: is a file, not a folder" in capsys.readouterr().err
