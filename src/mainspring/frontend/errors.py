"""The one error type of the frontends: an HTTP status, a message, and the scheduler's outcome."""

from __future__ import annotations

from mainspring.protocol import Outcome


class InferenceError(Exception):
    """A request that gets no result: an HTTP status and a message for the client."""

    def __init__(self, status: int, message: str, outcome: Outcome | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.outcome = outcome  # the scheduler's, when the scheduler answered
