"""What the frontends need from the controller: ``ControllerService`` in the controller's process,
``RemoteController`` (``frontend/remote.py``) in a frontend process of its own; and the vocabulary they
share (a served model, an answer, a refusal), here so that a frontend process imports neither the
controller nor, through it, the policies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mainspring.models.profile import ModelProfile
from mainspring.protocol import Response
from mainspring.protocol.models import ModelConfig
from mainspring.protocol.tensors import Sample
from mainspring.telemetry.metrics import ModelStats

Answer = tuple[Response, Any]  # one request's response, and its outputs when it was served


class ServiceError(Exception):
    """A request the service cannot take; ``kind`` is ``unavailable``, ``overloaded``, ``not_found`` or ``invalid``."""

    def __init__(self, kind: str, message: str, never_ran: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        # No answer will come from where the call went (its controller died, or a new run of it refused
        # the call): another controller may take it. It may have run on the dead one, never to be answered.
        self.never_ran = never_ran


@dataclass
class ServedModel:
    config: ModelConfig
    profile: ModelProfile
    version: int = 1
    key: str = ""  # what the policy and workers call it: its name, or ``name@n`` once reloaded in place
    # (config and profile carry the name: they are what clients and frontend processes read)

    def __post_init__(self) -> None:
        self.key = self.key or self.config.name


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

    async def infer(
        self, model: str, samples: Sequence[Sample], slo_ns: int, waited_ns: int = 0, traceparent: str = ""
    ) -> list[Answer]:
        """One call of ``samples`` (a request each, one deadline: ``slo_ns`` after its first byte was read,
        resolved once at the edge, ``resolve_slo_ns``); ``waited_ns``: how long the call already waited
        since its first byte was read (it counts against the deadline); ``traceparent``: the frontend's span
        of a sampled call (W3C), for the controller's spans of its requests ("": not traced)."""
        ...

    async def warm(self, model: str) -> bool:
        """Load ``model`` before its requests come (a cell that takes it over); False where nothing was
        loaded (held already, or a policy that does not warm)."""
        ...

    async def load_model(self, model: str, timeout_s: float = 120.0) -> None: ...

    async def reload_model(self, model: str, timeout_s: float = 120.0) -> None:
        """Serve the repository's changed entry for a served model without refusing its requests meanwhile."""
        ...

    async def unload_model(self, model: str, timeout_s: float = 60.0) -> None: ...

    async def model_statistics(self, model: str) -> ModelStats: ...

    async def exposition(self) -> bytes: ...

    async def timeline_view(self, seconds: float, cursor: str = "") -> dict[str, Any]:
        """The live page's data over the last ``seconds``, or only what came since the view that gave ``cursor``
        (``telemetry.live_view``)."""
        ...

    def count_dropped_client(self, transport: str, cause: str) -> None:
        """Count a client gone mid-request or cut off (``frontend/connections.py``), in the metrics."""
        ...
