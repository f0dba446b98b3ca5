"""Client requests and the answers the scheduler gives them."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Request:
    """One client inference. ``deadline_ns`` is absolute, ``slo_ns`` relative."""

    id: int
    model: str
    arrival_ns: int
    deadline_ns: int
    slo_ns: int
    inputs: object = field(default=None, compare=False, repr=False)


class ResponseStatus(enum.Enum):
    SUCCESS = "success"
    REJECTED = "rejected"  # answered early: the deadline cannot be met
    TIMED_OUT = "timed_out"  # dropped after waiting too long
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Response:
    """The scheduler's answer to one request; ``action_id`` names the Infer that served it."""

    request_id: int
    status: ResponseStatus
    reason: str = ""
    action_id: int | None = None
