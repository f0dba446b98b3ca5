"""The scheduler contract (DESIGN section 4): a synchronous policy with no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from mainspring.protocol import Action, ActionResult, Request, Response


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
