"""What a worker serves, as controller and workers exchange it: a model's config (``config.json``
of the repository, or what a Triton ``config.pbtxt`` amounts to), what a worker announces about
each model, and the operations the controller asks of a worker's repository."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import msgspec

from mainspring.protocol.model_names import MODEL_KEY
from mainspring.protocol.requests import slo_problem
from mainspring.protocol.tensors import TensorSpec

FORMATS = ("torch_export", "torchscript", "safetensors", "onnx")


class ModelConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What ``config.json`` holds. ``architecture`` (a zoo name) is needed by the ``safetensors`` format only."""

    name: str
    format: str
    file: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    runtime: str = "torch"
    architecture: str | None = None
    architecture_args: dict[str, int] = msgspec.field(default_factory=dict)
    slo_ms: float | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.runtime != "torch":
            raise ValueError(f"runtime {self.runtime!r} is not supported (only 'torch')")
        if not self.inputs or not self.outputs:
            raise ValueError("a model needs at least one input and one output")
        if not self.batch_sizes or any(b <= 0 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes {list(self.batch_sizes)} must be positive")
        if list(self.batch_sizes) != sorted(set(self.batch_sizes)):
            raise ValueError(f"batch_sizes {list(self.batch_sizes)} must be increasing without repeats")
        if self.format == "safetensors" and not self.architecture:
            raise ValueError("format 'safetensors' needs an 'architecture' (a zoo model name)")
        if not MODEL_KEY.fullmatch(self.name):  # a worker's config names a reload by its key
            raise ValueError(f"name {self.name!r} must be letters, digits, '_', '.' or '-' (at most 128)")
        if Path(self.file).name != self.file or self.file in ("", ".", ".."):
            raise ValueError(f"file {self.file!r} must be a file name in the version folder, not a path")
        problem = None if self.slo_ms is None else slo_problem("slo_ms", self.slo_ms)
        if problem is not None:
            raise ValueError(problem)
        for spec in (*self.inputs, *self.outputs):
            if spec.shape[0] != -1:
                raise ValueError(f"tensor {spec.name!r}: the first (batch) dimension must be -1")

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]


class ModelInfo(msgspec.Struct, frozen=True):
    """A model a worker serves: its config and its profile (``ModelProfile.to_json``) on the worker's device kind."""

    config: ModelConfig
    profile: dict[str, Any]
    version: int = 1
    load_ns: int = 0  # how long the worker took to read, hold and warm it up; 0: not measured


class ModelOperation(enum.Enum):
    """What the controller asks of a worker's repository (the repository API's load and unload)."""

    LOAD = "load"
    UNLOAD = "unload"


class ModelTarget(msgspec.Struct, frozen=True):
    """What a ``ModelOperation`` acts on: a repository model at ``version`` (None: the one the repository
    serves now), known to the controller as ``served_as`` ("": its own name; else an internal name)."""

    model: str
    version: int | None = None
    served_as: str = ""

    @property
    def key(self) -> str:
        """The name the worker keeps it under and actions name it by."""
        return self.served_as or self.model


class ModelReply(msgspec.Struct, frozen=True, tag=True):
    """A worker's answer to a ``ModelOperation``: the model's info once loaded, or what failed."""

    op_id: int
    model: str  # the target's key
    error: str = ""
    info: ModelInfo | None = None
