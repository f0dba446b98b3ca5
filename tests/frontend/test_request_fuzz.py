"""Whatever a client sends, the request decoders answer a tensor or a 400 naming the problem:
never another exception (which would be a 500), never an allocation past the limits."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mainspring.frontend.dataplane import InferenceError, decode_tensor, requested_slo_ns
from mainspring.frontend.extensions import check_priority, class_count
from mainspring.frontend.http import _inputs, _requested_outputs
from mainspring.frontend.limits import RequestLimits
from mainspring.frontend.shared_memory import SharedMemoryRegions
from mainspring.protocol.tensors import DATATYPES

LIMITS = RequestLimits(max_elements=10_000, max_string_bytes=64, max_json_depth=8)
REGIONS = SharedMemoryRegions()  # none registered: a placement fuzzed is refused with a 400

# The float extremes every numeric parameter must survive (st.floats() reaches them only by luck).
EXTREMES = st.sampled_from(
    [1e308, -1e308, 1.8e305, 1.7e302, math.inf, -math.inf, math.nan, -0.0, 0.0, 5e-324, 2**63, 10**400, -(10**400)]
)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | EXTREMES | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)
shapes = st.lists(st.integers(-2, 6) | st.sampled_from([10**6, 10**12, 2**63]), max_size=4)
datatypes = st.sampled_from([*DATATYPES, "BYTES", "fp32", ""]) | st.text(max_size=6)
input_entries = st.fixed_dictionaries(
    {"name": st.text(max_size=8) | st.integers(), "datatype": datatypes, "shape": shapes | json_values},
    optional={
        "data": json_values | st.lists(st.floats() | st.integers(), max_size=40),
        "parameters": st.fixed_dictionaries(
            {}, optional={"binary_data_size": st.integers(-4, 64) | EXTREMES | json_values}
        )
        | json_values,
    },
)


def attempt(call: Callable[[], Any]) -> tuple[Any, InferenceError | None]:
    """The call's result, or the ``InferenceError`` it raised (any other exception fails the test)."""
    try:
        return call(), None
    except InferenceError as error:
        return None, error


def refused_with_400(error: InferenceError) -> None:
    assert error.status == 400 and error.message


@settings(max_examples=400, deadline=None)
@given(value=st.lists(input_entries, max_size=3) | json_values, binary=st.binary(max_size=64))
@example(value=[{"name": "x", "datatype": "FP32", "shape": [10**12]}], binary=b"")  # a trillion values, no data
@example(value=[{"name": "x", "datatype": "FP32", "shape": [2], "data": [[[[1.0]]], [[[2.0]]]]}], binary=b"")
@example(value=[{"name": "0", "datatype": "BOOL", "shape": [0, 2**63], "data": []}], binary=b"")  # found: was a 500
@example(value=[{"name": "x", "datatype": "INT8", "shape": [1], "data": [1e300]}], binary=b"")
@example(value=[{"name": "0", "datatype": "FP16", "shape": [], "data": [65520.0]}], binary=b"")  # found: a 500
def test_any_inputs_decode_to_tensors_of_their_shape_or_a_400(value: Any, binary: bytes) -> None:
    tensors, error = attempt(lambda: _inputs(value, binary, LIMITS, REGIONS))
    if error is not None:
        refused_with_400(error)
        return
    for tensor in tensors:
        assert list(tensor.data.shape) == tensor.shape and tensor.data.dtype == DATATYPES[tensor.datatype]
    assert sum(t.data.size for t in tensors) <= LIMITS.max_elements


@settings(max_examples=200, deadline=None)
@given(value=json_values)
def test_any_outputs_value_is_read_or_refused(value: Any) -> None:
    requested, error = attempt(lambda: _requested_outputs(value, LIMITS, REGIONS))
    if error is not None:
        refused_with_400(error)
        return
    assert all(isinstance(name, str) for name in requested)


@settings(max_examples=300, deadline=None)
@given(document=json_values)
def test_any_document_passes_or_is_refused_for_depth_or_length(document: Any) -> None:
    _, error = attempt(lambda: LIMITS.check_document(document))
    if error is not None:
        refused_with_400(error)
        assert "max_json_depth" in error.message or "max_string_bytes" in error.message


def nested(levels: int) -> Any:
    """``levels`` lists, one inside the other."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def test_depth_limit_counts_levels_and_skips_tensor_data() -> None:
    LIMITS.check_document(nested(8))
    with pytest.raises(InferenceError, match="max_json_depth"):
        LIMITS.check_document(nested(9))
    # Tensor data is numbers checked against the shape, not walked here.
    LIMITS.check_document({"inputs": [{"name": "x", "data": nested(40)}]})
    with pytest.raises(InferenceError, match="max_string_bytes"):
        LIMITS.check_document({"id": "x" * 65})


def test_a_huge_shape_is_refused_before_anything_is_allocated() -> None:
    with pytest.raises(InferenceError, match="max_elements") as refused:
        decode_tensor("x", "FP32", [10**9, 10**9], None, b"", LIMITS)
    assert refused.value.status == 400
    tensor, count = decode_tensor("x", "FP32", [2, 3], list(range(6)), None, LIMITS)
    assert count == 6 and np.array_equal(tensor.data, np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize(("datatype", "value"), [("FP16", 65520.0), ("FP32", 1e300), ("INT8", 300), ("UINT8", -1)])
def test_a_value_past_its_datatypes_range_is_a_400_naming_it(datatype: str, value: float) -> None:
    with pytest.raises(InferenceError, match=f"out of range for {datatype}") as refused:
        decode_tensor("x", datatype, [1], [value], None, LIMITS)
    assert refused.value.status == 400


numbers = EXTREMES | st.floats() | st.integers() | st.booleans() | st.text(max_size=4) | st.none()


@settings(max_examples=300, deadline=None)
@given(parameters=st.dictionaries(st.sampled_from(["slo_ms", "timeout", "priority"]), numbers, max_size=3),
       classes=numbers)  # fmt: skip
@example(parameters={"slo_ms": 1e308}, classes=1)  # found: an OverflowError, a 500
@example(parameters={"timeout": 1.8e305}, classes=1)
@example(parameters={"slo_ms": 200, "timeout": -5}, classes=1)  # found: the timeout was not checked
@example(parameters={"slo_ms": 10**400}, classes=1)  # found in review: math.isinf overflowed on it, a 500
def test_numeric_parameters_are_taken_in_range_or_refused_with_a_400_naming_them(
    parameters: dict[str, Any], classes: Any
) -> None:
    slo_ns, error = attempt(lambda: requested_slo_ns(parameters))
    if error is not None:
        refused_with_400(error)
        assert any(repr(key) in error.message for key in parameters), error.message
    elif slo_ns is not None:
        assert isinstance(slo_ns, int) and 0 < slo_ns <= 86_400 * 10**9
    for key in ("slo_ms", "timeout"):  # each one given is checked, also when another decides
        value = parameters.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and (value < 0 or value != value):  # NaN
            assert error is not None
    _, error = attempt(lambda: check_priority(parameters))
    if error is not None:
        refused_with_400(error)
    count, error = attempt(lambda: class_count({"classification": classes}, "out"))
    assert (error is not None and error.status == 400) or (isinstance(count, int) and count >= 1)
