"""Model files are read by loaders that do not run pickled Python: a file crafted to run code
when unpickled is refused with ``ModelLoadError`` and its code never runs."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import pytest

from mainspring.models.errors import ModelLoadError
from mainspring.models.loading import load_module
from mainspring.models.repository import ModelRepository
from mainspring.protocol.models import ModelConfig
from mainspring.protocol.tensors import TensorSpec


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize(("fmt", "file"), [("torch_export", "model.pt2"), ("torchscript", "model.pt")])
@pytest.mark.parametrize("wrapped", [False, True], ids=["bare-pickle", "in-a-torch-zip"])
def test_a_pickle_that_runs_code_is_refused_and_never_runs(tmp_path: Path, fmt: str, file: str, wrapped: bool) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "repo").mkdir()
    repo = ModelRepository(tmp_path / "repo")
    spec = (TensorSpec("x", "FP32", (-1, 4)),)
    folder = repo.write(ModelConfig(name="evil", format=fmt, file=file, inputs=spec, outputs=spec))
    payload = pickle.dumps(Payload(marker))
    if wrapped:  # the layout torch.save and torch.jit.save use: a zip whose data.pkl is the pickle
        with zipfile.ZipFile(folder / file, "w") as archive:
            archive.writestr("evil/data.pkl", payload)
            archive.writestr("evil/version", "3\n")
    else:
        (folder / file).write_bytes(payload)
    with pytest.raises(ModelLoadError, match="cannot load"):
        load_module(repo, "evil")
    assert not marker.exists()
