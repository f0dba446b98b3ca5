"""Protocol extensions beyond KServe v2's core: Triton's classification (served), priority (accepted, one level)
and sequences (refused).

Classification:
An output requested with the parameter ``classification: N`` is returned as its top N classes
instead of its values: a BYTES tensor of shape [batch, N] whose elements read ``"<value>:<index>"``,
highest value first, with ``:<label>`` where the output has labels (Triton's ``label_filename``).
The values after the batch dimension are the classes; N above their number returns them all.

Sequences (``sequence_id``, ``sequence_start``, ``sequence_end``): no model here keeps state
between requests (``sequence_batching`` configs are refused), so a request that names a sequence
would be answered as if alone; refused instead. ``tritonclient`` sends none unless asked.

Priority (``priority``, Triton's schedule-policy parameter: 1 the highest level, 0 the model's default):
every level is served alike, by deadline, as Triton serves a model that configures no
``priority_levels``; the request's SLO (``timeout``) is what orders it. A value that is not a
non-negative integer is refused, as Triton refuses it, rather than read as some level.

Shared memory (``shared_memory_region`` on an input or output): Triton's system shared-memory
extension, served by ``frontend/shared_memory.py``; CUDA shared memory is refused by name.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mainspring.frontend.errors import InferenceError

PARAMETER = "classification"
SEQUENCE = ("sequence_id", "sequence_start", "sequence_end")


def refuse_sequence(parameters: Mapping[str, Any]) -> None:
    """400 for a request that is part of a sequence (a stateful model's): none is served here."""
    for key in SEQUENCE:
        if parameters.get(key) not in (None, 0, "", False):
            raise InferenceError(400, f"parameter {key!r}: sequences are not supported (no model here keeps "
                                      "state between requests)")  # fmt: skip


def check_priority(parameters: Mapping[str, Any]) -> None:
    """400 for a ``priority`` that is no level (levels are served alike: see the module's text)."""
    value = parameters.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InferenceError(400, f"parameter 'priority' must be a non-negative integer, got {value!r}")


def class_count(parameters: Mapping[str, Any], output: str) -> int:
    """The ``classification`` parameter of a requested output: how many classes (0: not asked)."""
    if PARAMETER not in parameters:
        return 0
    count = parameters[PARAMETER]
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InferenceError(400, f"output {output!r}: {PARAMETER} must be a positive integer, got {count!r}")
    return count


def classify(output: str, data: np.ndarray[Any, Any], count: int, labels: Sequence[str] = ()) -> np.ndarray[Any, Any]:
    """The top ``count`` classes of each sample of ``data`` ([batch, ...]), as ``b"value:index"``, or
    ``b"value:index:label"`` for a class that ``labels`` names."""
    if data.dtype.kind not in "biuf":
        raise InferenceError(400, f"output {output!r}: {PARAMETER} needs a numeric output, not {data.dtype}")
    scores = data.reshape(len(data), -1)
    count = min(count, scores.shape[1])
    order = np.argsort(-scores.astype(np.float64), axis=1, kind="stable")[:, :count]  # ties: the lower index first
    names = [f":{label}" for label in labels]
    result = np.empty((len(scores), count), dtype=object)
    for row, indices in enumerate(order):
        for column, index in enumerate(indices):
            label = names[index] if index < len(names) else ""
            result[row, column] = f"{scores[row, index].item()}:{index}{label}".encode()
    return result


def serialize_bytes(data: np.ndarray[Any, Any]) -> bytes:
    """A BYTES tensor as the protocol's binary form: each element a 4-byte little-endian length, then its bytes."""
    return b"".join(struct.pack("<I", len(element)) + element for element in data.ravel())


def json_bytes(data: np.ndarray[Any, Any]) -> list[str]:
    """A BYTES tensor's elements as JSON strings (the HTTP protocol's ``data`` of a BYTES tensor)."""
    return [element.decode("utf-8", errors="replace") for element in data.ravel()]
