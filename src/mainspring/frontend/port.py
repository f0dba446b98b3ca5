"""What the frontends need from the controller: ``ControllerService`` in the controller's process,
``RemoteController`` (``frontend/remote.py``) in a frontend process of its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from mainspring.controller.service import Answer, ServedModel
from mainspring.protocol.tensors import Sample
from mainspring.telemetry.metrics import ModelStats


class ControllerPort(Protocol):
    @property
    def models(self) -> Mapping[str, ServedModel]: ...

    @property
    def device_count(self) -> int: ...

    @property
    def accepting(self) -> bool: ...

    @property
    def load_errors(self) -> Mapping[str, str]: ...

    @property
    def default_slo_ns(self) -> int: ...

    async def refresh(self) -> bool:
        """Bring the view of models and devices up to date; False when it cannot be staler than it is."""
        ...

    async def infer(self, model: str, samples: Sequence[Sample], slo_ns: int | None = None) -> list[Answer]: ...

    async def load_model(self, model: str, timeout_s: float = 120.0) -> None: ...

    async def reload_model(self, model: str, timeout_s: float = 120.0) -> None:
        """Serve the repository's changed entry for a served model without refusing its requests meanwhile."""
        ...

    async def unload_model(self, model: str, timeout_s: float = 60.0) -> None: ...

    async def model_statistics(self, model: str) -> ModelStats: ...

    async def exposition(self) -> bytes: ...

    async def timeline_view(self, seconds: float) -> dict[str, Any]: ...

    def count_dropped_client(self, transport: str, cause: str) -> None:
        """Count a client gone mid-request or cut off (``frontend/connections.py``), in the metrics."""
        ...
