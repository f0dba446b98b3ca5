"""Messages between frontend processes and the controller (``serve --frontends N``), and their wire form.

As between controller and workers (``messages.py``): one msgpack header frame, then one raw frame per
tensor in the order the header's metas name them, so tensor bytes decoded once by a frontend travel
to the controller, and outputs back, without another encoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from mainspring.protocol import Outcome
from mainspring.protocol.models import ModelInfo
from mainspring.transport.messages import CodecError, TensorMeta, samples_of


# frontend -> controller
class Join(msgspec.Struct, frozen=True, tag=True):
    frontend: str


class Submit(msgspec.Struct, frozen=True, tag=True):
    """One client call: a request per sample, one SLO."""

    call: int
    model: str
    slo_ns: int  # resolved at the edge (the request's, else its model's, else the server's)
    inputs: list[list[TensorMeta]]
    waited_ns: int = 0  # since the call's first byte was read: counts against its deadline
    traceparent: str = ""  # the frontend's span of a sampled call (W3C trace context); "": not traced


class Ask(msgspec.Struct, frozen=True, tag=True):
    """Anything else a frontend needs answered: ``what`` is load, reload, unload, statistics, metrics, timeline or
    state (a fresh ``State``, sent before the reply)."""

    call: int
    what: str
    model: str = ""
    seconds: float = 0.0
    models: tuple[str, ...] = ()  # signal_models: the models a cell's load signal is to carry
    cursor: str = ""  # timeline: the cursor of the live page's last view ("": the whole window)


# Why a client went without an answer read (``Dropped``; ``mainspring_client_disconnects_total``'s cause label).
CAUSES = {
    "hung_up": "hung up mid-request",
    "header_timeout": "sent no complete headers in time (header_timeout_s)",
    "body_timeout": "sent no complete body in time (body_timeout_s)",
    "connection_limit": "were refused a connection (max_connections)",
    "shed": "were refused at arrival: the server's own CPU was behind (counted as overloaded rejections)",
}


class Dropped(msgspec.Struct, frozen=True, tag=True):
    """Clients this frontend saw go mid-request or cut off since its last ``Dropped``: (transport, cause, count)."""

    counts: list[tuple[str, str, int]]


class Applied(msgspec.Struct, frozen=True, tag=True):
    """The frontend answers from ``State`` number ``seq`` now (a load or unload waits for every one)."""

    seq: int


# controller -> frontend
class State(msgspec.Struct, frozen=True, tag=True):
    """What a frontend answers health and metadata calls from; sent on join and on every change."""

    models: list[ModelInfo]
    device_count: int
    accepting: bool
    load_errors: dict[str, str]
    default_slo_ns: int
    seq: int = 0
    in_line: bool = True  # a cell: False until the server says it serves what the other cells serve
    pool_bytes: int = 0  # its devices' weight pools together (0: an older controller: the default per device)


class Answers(msgspec.Struct, frozen=True, tag=True):
    """The call's answers in sample order; ``outputs`` of the served ones (empty for the others)."""

    call: int
    outcomes: list[Outcome]
    reasons: list[str]
    outputs: list[list[TensorMeta]]


RESTARTED = "restarted"  # a Refused kind: sent to a process of the controller that died, so never run


class Refused(msgspec.Struct, frozen=True, tag=True):
    """The call failed as a whole: ``kind`` is a ``ServiceError`` kind (not_found, invalid, ...), or
    ``RESTARTED``."""

    call: int
    kind: str
    message: str


class Reply(msgspec.Struct, frozen=True, tag=True):
    call: int
    value: Any = None


FrontendMessage = Join | Submit | Ask | Applied | Dropped | State | Answers | Refused | Reply

_decoder = msgspec.msgpack.Decoder(FrontendMessage)


def decode_frontend(
    frames: Sequence[bytes | memoryview], copy: bool = True
) -> tuple[FrontendMessage, list[dict[str, np.ndarray[Any, Any]]] | None]:
    """The message and the tensors it carries (``Submit`` inputs, ``Answers`` outputs): writable copies, or
    with ``copy`` False read-only views of the frames; ``CodecError`` for anything else."""
    try:
        message = _decoder.decode(frames[0])
        metas = (
            message.inputs if isinstance(message, Submit) else message.outputs if isinstance(message, Answers) else None
        )
        return message, None if metas is None else samples_of(metas, frames, copy)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError, IndexError) as error:
        raise CodecError(f"malformed frontend message: {error}") from None
