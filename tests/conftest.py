"""Session fixtures shared by the worker, profiler and serving tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from mainspring.models.repository import ModelRepository
from tests.torch_models import export_small_zoo


@pytest.fixture(scope="session")
def small_zoo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """mlp (torch.export), resnet18 at 48x48 (TorchScript), bert_tiny (safetensors). Do not modify."""
    return export_small_zoo(Path(tmp_path_factory.mktemp("zoo")) / "repo")
