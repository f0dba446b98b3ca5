"""What a request may be, and how long and how many clients may take: limits checked before any work
is done for a request.

A server reachable by untrusted clients must bound what one request can make it allocate or
walk, and how long a connection may hold a file descriptor without sending a request. The body
is bounded by the transports (HTTP 413, gRPC ``RESOURCE_EXHAUSTED``), header lines by aiohttp,
connections and their timeouts by ``frontend/connections.py`` (HTTP) and gRPC's own channel
options; everything else here answers 400 naming the limit and its setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mainspring.frontend.errors import InferenceError

MIB = 1024 * 1024


@dataclass(frozen=True)
class RequestLimits:
    max_body_bytes: int = 64 * MIB  # a 224x224x3 FP32 image is 0.6 MiB; a batch of 64 of them fits
    max_header_bytes: int = 16 * 1024  # one HTTP header line or field
    max_inputs: int = 64  # tensors per request (inputs and requested outputs, each)
    max_elements: int = 16 * MIB  # values per request, all inputs together
    max_string_bytes: int = 4096  # any string outside tensor data: names, ids, parameters
    max_json_depth: int = 16  # nesting of the JSON document outside tensor data
    # HTTP connections open at once per frontend process: past it a new one is answered 503 and closed.
    # (A gRPC connection carries any number of calls; its idle and age bounds below close it.)
    max_connections: int = 1000
    header_timeout_s: float = 10.0  # from a request's first byte to its last header line (HTTP 408, closed)
    body_timeout_s: float = 60.0  # from the headers to the body's last byte (HTTP 408, closed)
    # A connection with no request under way is closed (HTTP keep-alive; gRPC max_connection_idle).
    idle_timeout_s: float = 60.0
    # gRPC: a connection is asked to go away (GOAWAY; clients reconnect) this long after it opened, and
    # cut a grace period later with whatever calls it still has: a stream cannot hold a connection forever.
    max_connection_age_s: float = 3600.0
    max_connection_age_grace_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes", "max_inputs", "max_elements", "max_string_bytes",
                     "max_connections", "header_timeout_s", "body_timeout_s", "idle_timeout_s",
                     "max_connection_age_s", "max_connection_age_grace_s"):  # fmt: skip
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):  # NaN and inf too
                raise ValueError(f"{name}={value} must be positive and finite")
        if self.max_json_depth < 4:  # the request object, inputs, an input, its parameters
            raise ValueError(f"max_json_depth={self.max_json_depth} must be at least 4")

    def check_count(self, what: str, count: int) -> None:
        if count > self.max_inputs:
            raise InferenceError(400, f"{count} {what} exceed the limit of {self.max_inputs} (max_inputs)")

    def check_elements(self, name: str, count: int, so_far: int) -> int:
        """Add one tensor's ``count`` values to the request's total; 400 past ``max_elements``."""
        total = so_far + count
        if total > self.max_elements:
            raise InferenceError(
                400, f"input {name[:64]!r}: {total} values in the request exceed the limit of "
                f"{self.max_elements} (max_elements)"
            )  # fmt: skip
        return total

    def check_string(self, what: str, value: str) -> None:
        """400 naming ``what`` (never quoting ``value``: it is too long to echo) past ``max_string_bytes``."""
        if len(value) > self.max_string_bytes:
            raise InferenceError(
                400, f"{what} is {len(value)} characters long, over the limit of {self.max_string_bytes} "
                "(max_string_bytes)"
            )  # fmt: skip

    def check_document(self, document: Any) -> None:
        """Depth and string lengths of a decoded JSON request, skipping tensor ``data`` (numbers,
        checked against the tensor's shape when decoded). Iterative: depth is what is checked."""
        stack: list[tuple[Any, int, str]] = [(document, 1, "request")]
        while stack:
            value, depth, where = stack.pop()
            if isinstance(value, str):
                self.check_string(where, value)
                continue
            if not isinstance(value, dict | list):
                continue
            if depth > self.max_json_depth:
                raise InferenceError(
                    400, f"{where} is nested deeper than {self.max_json_depth} levels (max_json_depth)"
                )
            if isinstance(value, list):
                stack.extend((item, depth + 1, f"{where}[{i}]") for i, item in enumerate(value))
                continue
            for key, item in value.items():
                self.check_string(f"a key of {where}", key)
                if key != "data":
                    stack.append((item, depth + 1, f"{where}.{key}"))
