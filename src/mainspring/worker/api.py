"""The in-process worker interface.

A ``Worker`` announces its devices and the profiles of the models it serves, takes
actions (with the inputs of each request for an ``Infer``) and delivers every result
through the callback it was built with, from its own threads. The torch runtime
(``TorchWorker``) and ``EmulatedWorker`` (``worker/emulated_worker.py``) implement the
same interface, so the network worker and the tests of the live system use either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from mainspring.models.errors import ModelLoadError
from mainspring.models.profile import ModelProfile
from mainspring.protocol import Action, ActionResult, DeviceSpec
from mainspring.protocol.devices import GpuMemory
from mainspring.protocol.models import ModelConfig, ModelInfo, ModelOperation, ModelReply, ModelTarget
from mainspring.protocol.tensors import Sample

ResultCallback = Callable[[ActionResult], None]


class Worker(Protocol):
    """What the controller side needs from a worker, local or behind a socket."""

    @property
    def devices(self) -> Sequence[DeviceSpec]: ...

    load_errors: dict[str, str]  # models that could not be served, with the reason

    def profiles(self) -> Mapping[str, ModelProfile]:
        """Every served model's profile on this worker's device kind."""
        ...

    def configs(self) -> Mapping[str, ModelConfig]: ...

    def version_of(self, model: str) -> int:
        """The repository version served under ``model``."""
        ...

    def load_ns_of(self, model: str) -> int:
        """How long registering ``model`` took (0: not measured)."""
        ...

    def gpu_memory(self) -> tuple[GpuMemory, ...]:
        """Its GPUs' memory now (none without a GPU)."""
        ...

    def register(self, model: str, version: int | None = None, served_as: str = "") -> ModelProfile:
        """Start serving a repository model (at ``version``; None: the repository's), under ``served_as``
        (its key, ``protocol/model_names.py``; "": its own name); ``ModelLoadError`` with the reason if it cannot."""
        ...

    def unregister(self, model: str) -> None: ...

    def resident_models(self, device: int) -> frozenset[str]:
        """Models whose weights ``device`` (this worker's id) holds now."""
        ...

    def submit(self, action: Action, inputs: Sequence[Sample] | None = None) -> None: ...

    def close(self) -> None: ...


def model_info(worker: Worker, model: str) -> ModelInfo:
    """What a worker announces about one of its models."""
    profile = worker.profiles()[model].to_json()
    return ModelInfo(worker.configs()[model], profile, worker.version_of(model), worker.load_ns_of(model))


def apply_model_operation(worker: Worker, op_id: int, operation: ModelOperation, target: ModelTarget) -> ModelReply:
    """Register or unregister a repository model on ``worker``; the reply names what failed."""
    key = target.key
    try:
        if operation is ModelOperation.LOAD:
            worker.register(target.model, target.version, target.served_as)
            return ModelReply(op_id, key, info=model_info(worker, key))
        worker.unregister(key)
        return ModelReply(op_id, key)
    except ModelLoadError as error:
        return ModelReply(op_id, key, error=str(error))
