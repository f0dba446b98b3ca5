"""Tensor descriptions shared by the model repository, the workers and the frontend.

Datatype names are the KServe v2 / Open Inference Protocol ones (``FP32``, ``INT64``...).
A shape uses -1 for a dimension of any size; the first dimension is the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np

# One request's tensors by input (or output) name: what travels with an Infer, and back.
Sample = Mapping[str, np.ndarray[Any, Any]]

DATATYPES: Mapping[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    try:
        return DATATYPES[datatype]
    except KeyError:
        raise ValueError(f"unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}") from None


def datatype_of(dtype: np.dtype[Any]) -> str:
    try:
        return _NAMES[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no KServe datatype") from None


class TensorSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    """One named input or output: datatype and shape (-1 for any size, first dimension the batch).
    ``valid_range`` (integer inputs): the least and greatest value the model takes, checked at the door.
    ``labels`` (outputs): a name per class, returned with the classification extension's answers
    (Triton's ``label_filename``)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    valid_range: tuple[int, int] | None = None
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        dtype = numpy_dtype(self.datatype)
        if not self.name:
            raise ValueError("tensor name must not be empty")
        if not self.shape or any(d < -1 or d == 0 for d in self.shape):
            raise ValueError(f"tensor {self.name!r}: bad shape {list(self.shape)} (positive sizes or -1)")
        if self.valid_range is not None:
            low, high = self.valid_range
            if dtype.kind not in "iu" or low > high:
                raise ValueError(f"tensor {self.name!r}: valid_range {list(self.valid_range)} needs an integer "
                                 f"datatype and low <= high")  # fmt: skip

    def check_range(self, array: np.ndarray[Any, Any]) -> None:
        """Raise ``ValueError`` when ``array`` holds a value outside ``valid_range``."""
        if self.valid_range is None or not array.size:
            return
        low, high = self.valid_range
        least, greatest = int(array.min()), int(array.max())
        if least < low or greatest > high:
            bad = least if least < low else greatest
            raise ValueError(f"input {self.name!r}: value {bad} is outside the model's valid_range [{low}, {high}]")

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample: without the batch dimension."""
        return self.shape[1:]

    def check_sample(self, array: np.ndarray[Any, Any], where: str) -> None:
        """Raise ``ValueError`` naming ``where`` unless ``array`` is one sample (batch 1) of this tensor."""
        expected = numpy_dtype(self.datatype)
        if array.dtype != expected:
            raise ValueError(f"{where}: datatype {datatype_of(array.dtype)} does not match {self.datatype}")
        if not shape_matches((1, *self.sample_shape), array.shape):
            wanted = [1, *self.sample_shape]
            raise ValueError(f"{where}: shape {list(array.shape)} does not match {wanted}")


def shape_matches(pattern: Sequence[int], shape: Sequence[int]) -> bool:
    return len(pattern) == len(shape) and all(p in (-1, s) for p, s in zip(pattern, shape, strict=True))


def sample_problem(specs: Sequence[TensorSpec], sample: object) -> str | None:
    """Why ``sample`` is not one sample of exactly the tensors ``specs`` name (their names, datatypes and
    shapes with a batch of 1); None when it is. What a worker returns is checked so before a client sees it."""
    if not isinstance(sample, Mapping):
        return f"a {type(sample).__name__} in place of named tensors"
    names, wanted = set(sample), {spec.name for spec in specs}
    if names != wanted:
        missing, extra = sorted(wanted - names), sorted(map(str, names - wanted))
        return f"tensors {sorted(map(str, names))} in place of {sorted(wanted)} (missing {missing}, unknown {extra})"
    for spec in specs:
        array = sample[spec.name]
        if not isinstance(array, np.ndarray):
            return f"output {spec.name!r}: a {type(array).__name__}, not an array"
        try:
            spec.check_sample(array, f"output {spec.name!r}")
        except ValueError as error:
            return str(error)
    return None
