"""A request's input tensors as the data plane takes them: decoded from JSON values or raw bytes into
numpy, within the server's limits, or a 400 (``InferenceError``) naming what is wrong. Both transports
(``http.py``, ``grpc.py``) decode here."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mainspring.frontend.errors import InferenceError
from mainspring.frontend.limits import RequestLimits
from mainspring.protocol.tensors import DATATYPES

MAX_DIMENSIONS = 32  # numpy's own limit is 64


@dataclass
class Tensor:
    """A named tensor in the protocol's terms; ``data`` has ``shape``."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray[Any, Any]


def decode_tensor(
    name: str, datatype: str, shape: Any, data: Any, raw: bytes | None, limits: RequestLimits, so_far: int = 0
) -> tuple[Tensor, int]:
    """Build a tensor from JSON data (flat or nested) or raw bytes, and the request's values counted
    so far with it (``so_far`` before); ``InferenceError`` 400 names what is wrong."""
    limits.check_string("an input name", name)
    dtype = DATATYPES.get(datatype)
    if dtype is None:
        raise InferenceError(400, f"input {name!r}: unsupported datatype {datatype[:64]!r}")
    if not isinstance(shape, list | tuple) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                      for d in shape):  # fmt: skip
        raise InferenceError(400, f"input {name!r}: shape must be a list of non-negative integers, got {shape!r}"[:300])
    if len(shape) > MAX_DIMENSIONS:
        raise InferenceError(400, f"input {name!r}: shape has {len(shape)} dimensions, at most {MAX_DIMENSIONS}")
    # The largest dimension alone too: beside a zero, 2**63 passes the count and numpy raises (found by fuzzing).
    limits.check_elements(name, max(shape, default=0), 0)
    count = math.prod(shape)
    so_far = limits.check_elements(name, count, so_far)
    if raw is not None:
        if len(raw) != count * dtype.itemsize:
            raise InferenceError(400, f"input {name!r}: {len(raw)} bytes of data, shape {list(shape)} of {datatype} "
                                      f"needs {count * dtype.itemsize}")  # fmt: skip
        array = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    else:
        try:
            # A value past the datatype's range is the client's error, not an inf or a wrapped integer.
            with np.errstate(over="raise", invalid="raise"):
                array = np.asarray(data, dtype=dtype)
        except (OverflowError, FloatingPointError):
            raise InferenceError(400, f"input {name!r}: a value is out of range for {datatype}") from None
        except (TypeError, ValueError):
            raise InferenceError(400, f"input {name!r}: data is not a list of {datatype} values") from None
        if array.size != count:
            raise InferenceError(400, f"input {name!r}: {array.size} values, shape {list(shape)} needs {count}")
        array = array.reshape(shape)
    return Tensor(name, datatype, list(shape), array), so_far
