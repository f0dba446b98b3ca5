"""The one error type of the frontends: an HTTP status, a message, and the scheduler's outcome."""

from __future__ import annotations

from mainspring.protocol import Outcome

# A message quotes what the client sent (a name, a value): bounded, so that an error never grows with the
# request (a 16 KiB model name echoed whole overflows gRPC's 8 KiB of metadata: "Stream removed").
MAX_MESSAGE_CHARS = 1000


class InferenceError(Exception):
    """A request that gets no result: an HTTP status and a message for the client."""

    def __init__(self, status: int, message: str, outcome: Outcome | None = None) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
        super().__init__(message)
        self.status = status
        self.message = message
        self.outcome = outcome  # the scheduler's, when the scheduler answered
