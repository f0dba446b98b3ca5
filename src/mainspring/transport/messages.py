"""Messages between controller and workers, and their wire form.

A message is one msgpack header frame (a tagged ``msgspec`` struct) followed by one raw
frame per tensor, in the order the header's ``TensorMeta`` lists name them. No pickle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from mainspring.protocol import Action, ActionResult, DeviceSpec
from mainspring.protocol.devices import GpuMemory
from mainspring.protocol.models import ModelInfo, ModelOperation, ModelReply, ModelTarget
from mainspring.protocol.tensors import Sample, datatype_of, numpy_dtype


class TensorMeta(msgspec.Struct, frozen=True, array_like=True):
    name: str
    datatype: str
    shape: tuple[int, ...]


# worker -> controller
class Hello(msgspec.Struct, frozen=True, tag=True):
    worker: str
    devices: list[DeviceSpec]
    models: list[ModelInfo]
    load_errors: dict[str, str] = {}


class Result(msgspec.Struct, frozen=True, tag=True):
    """``result.outputs`` travels as ``outputs``: per request, the metas of its tensor frames."""

    result: ActionResult
    outputs: list[list[TensorMeta]] | None = None


class Pong(msgspec.Struct, frozen=True, tag=True):
    controller_ns: int
    worker_ns: int
    gpus: tuple[GpuMemory, ...] = ()  # its GPUs' memory, for the controller's /metrics


# controller -> worker
class Act(msgspec.Struct, frozen=True, tag=True):
    action: Action
    inputs: list[list[TensorMeta]] | None = None


class Ping(msgspec.Struct, frozen=True, tag=True):
    controller_ns: int


class ModelOp(msgspec.Struct, frozen=True, tag=True):
    op_id: int
    op: ModelOperation
    target: ModelTarget


class Bye(msgspec.Struct, frozen=True, tag=True):
    reason: str = ""
    start_over: bool = False  # the worker must restart its process (a lane hung), not just rejoin


Message = Hello | Result | Pong | ModelReply | Act | Ping | ModelOp | Bye

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: msgspec.Struct, samples: Sequence[Sample | None] | None = None) -> list[bytes | memoryview]:
    """Header frame, then each sample's tensors as raw frames (C order)."""
    frames: list[bytes | memoryview] = [_encoder.encode(message)]
    for sample in samples or ():
        for array in (sample or {}).values():
            frames.append(np.ascontiguousarray(array).data.cast("B"))
    return frames


class CodecError(ValueError):
    """Frames that are not a message of this protocol (the receiver logs and drops them)."""


def decode(frames: Sequence[bytes | memoryview]) -> tuple[Message, list[dict[str, np.ndarray[Any, Any]]] | None]:
    """The message and, if it carries tensors, one dict per request (writable copies);
    ``CodecError`` for anything else, whatever the bytes."""
    try:
        return _decode(frames)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError, IndexError) as error:
        raise CodecError(f"malformed message: {error}") from None


def _decode(frames: Sequence[bytes | memoryview]) -> tuple[Message, list[dict[str, np.ndarray[Any, Any]]] | None]:
    if not frames:
        raise ValueError("no frames")
    message = _decoder.decode(frames[0])
    metas = message.inputs if isinstance(message, Act) else message.outputs if isinstance(message, Result) else None
    if metas is None:
        return message, None
    return message, samples_of(metas, frames)


def samples_of(
    metas: Sequence[Sequence[TensorMeta]], frames: Sequence[bytes | memoryview], copy: bool = True
) -> list[dict[str, np.ndarray[Any, Any]]]:
    """The tensors after a header frame, one dict per request as ``metas`` name them: writable copies, or
    with ``copy`` False read-only views of the frames (for a process that only passes them on)."""
    expected = sum(len(request_metas) for request_metas in metas)
    if expected != len(frames) - 1:
        raise ValueError(f"message has {len(frames) - 1} tensor frames, its header names {expected}")
    samples: list[dict[str, np.ndarray[Any, Any]]] = []
    index = 1
    for request_metas in metas:
        sample = {}
        for meta in request_metas:
            array = np.frombuffer(frames[index], dtype=numpy_dtype(meta.datatype)).reshape(meta.shape)
            sample[meta.name] = array.copy() if copy else array
            index += 1
        samples.append(sample)
    return samples


def metas_of(samples: Sequence[Sample | None]) -> list[list[TensorMeta]]:
    return [
        [TensorMeta(name, datatype_of(a.dtype), tuple(a.shape)) for name, a in (sample or {}).items()]
        for sample in samples
    ]
