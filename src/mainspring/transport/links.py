"""What the controller service sees of a worker, whatever carries its messages."""

from __future__ import annotations

from typing import Any, Protocol

from mainspring.protocol import Action, ActionResult, DeviceSpec
from mainspring.protocol.devices import GpuMemory
from mainspring.protocol.models import ModelInfo, ModelOperation, ModelReply, ModelTarget


class WorkerHandle(Protocol):
    """One connected worker. Actions carry the worker's own device ids and the controller's clock."""

    name: str

    @property
    def gpus(self) -> tuple[GpuMemory, ...]:
        """Its GPUs' memory, as it last reported it (none without a GPU)."""
        ...

    def send_action(self, action: Action, inputs: list[Any] | None) -> None: ...

    def model_op(self, op_id: int, op: ModelOperation, target: ModelTarget) -> None: ...

    def close(self, reason: str, start_over: bool = False) -> None: ...


class WorkerEvents(Protocol):
    """What a transport reports, always on the controller's event loop thread."""

    def on_join(
        self, handle: WorkerHandle, devices: list[DeviceSpec], models: list[ModelInfo], errors: dict[str, str]
    ) -> None: ...

    def on_result(self, handle: WorkerHandle, result: ActionResult) -> None:
        """``result.timing`` is on the controller's clock; ``result.device`` is the worker's device id."""
        ...

    def on_model_reply(self, handle: WorkerHandle, reply: ModelReply) -> None: ...

    def on_lost(self, handle: WorkerHandle) -> None: ...

    def on_bad_message(self, handle: WorkerHandle, problem: str) -> None:
        """A joined worker sent frames that are not a message of the protocol (it is to be dropped)."""
        ...

    def rejoin_wait_s(self, name: str) -> float:
        """How long a worker saying hello as ``name`` must still wait to join (0: it may now); its hellos
        go unanswered until then."""
        ...
