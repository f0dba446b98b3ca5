"""The scheduler contract (DESIGN section 4): a synchronous policy with no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from mainspring.models.profile import ModelProfile
from mainspring.protocol import Action, ActionResult, DeviceSpec, Request, Response


@dataclass(slots=True)
class Decisions:
    """What one ``schedule`` call decided.

    ``wakeup_ns`` is the time the policy next wants ``schedule`` called even if
    nothing arrives (a batching timer, a planned load); ``None`` means only on events.
    """

    actions: list[Action] = field(default_factory=list)
    responses: list[Response] = field(default_factory=list)
    wakeup_ns: int | None = None


class Scheduler(Protocol):
    """A policy. Never reads the clock, never sleeps, never does I/O.

    It answers every request exactly once (a result, an early rejection, or an error).
    """

    def on_request(self, request: Request, now_ns: int) -> None: ...

    def on_result(self, result: ActionResult, now_ns: int) -> None: ...

    def schedule(self, now_ns: int) -> Decisions: ...


@runtime_checkable
class Membership(Protocol):
    """Devices and models that come and go while serving (workers join or are lost, models are
    loaded or unloaded through the repository API). Optional: a policy without it serves a
    fixed set, as in the simulator."""

    def add_device(self, spec: DeviceSpec) -> None: ...

    def remove_device(self, device: int, now_ns: int) -> None:
        """The device is gone and its results will never come: requests in its in-flight batches
        are queued again where they can still make their deadline, else answered with an error."""
        ...

    def add_model(self, profile: ModelProfile) -> None: ...

    def remove_model(self, model: str, now_ns: int) -> None:
        """Answer the model's queued and in-flight requests with an error and forget where it is
        resident (the workers drop its weights themselves)."""
        ...


@runtime_checkable
class Warms(Protocol):
    """A policy that can load a model before its requests come (a cell taking a model over)."""

    def warm(self, model: str) -> bool:
        """Load ``model`` on a device with room; False when it is held already or unknown."""
        ...


@dataclass(frozen=True)
class Forecast:
    """What a policy predicts now, per model asked (a cell's load signal, ``cells/signal.py``)."""

    finish_ns: Mapping[str, int]  # the earliest end of a batch of one on a device holding it (absent: not held)
    cold_start_ns: int  # the earliest a load could start on a live device


@runtime_checkable
class Forecasts(Protocol):
    """A policy that plans ahead, and can say when work would end (read-only: never changes a decision)."""

    def forecast(self, models: Iterable[str], now_ns: int) -> Forecast: ...
