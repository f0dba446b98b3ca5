"""Senders for KServe v2 over HTTP (binary tensor extension) and gRPC, for any compliant server.

Inputs come from each model's metadata (``-1`` dimensions become 1; random values of the
datatype, integers small enough for any vocabulary). Each request carries its SLO as the
``timeout`` parameter in microseconds, which Mainspring reads as the SLO and Triton as the
queue timeout. A rejection is what the server says it is: HTTP 429/503 (gRPC
``RESOURCE_EXHAUSTED``/``UNAVAILABLE``) is a rejection, 504 (``DEADLINE_EXCEEDED``) a time-out,
anything else an error; the reason is the server's ``outcome`` when it gives one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from mainspring.protocol import ResponseStatus
from mainspring.protocol.tensors import numpy_dtype

HEADER_LENGTH = "Inference-Header-Content-Length"
_HTTP_STATUS = {429: ResponseStatus.REJECTED, 503: ResponseStatus.REJECTED, 504: ResponseStatus.TIMED_OUT}
_GRPC_STATUS = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResponseStatus.REJECTED,
    grpc.StatusCode.UNAVAILABLE: ResponseStatus.REJECTED,
    grpc.StatusCode.DEADLINE_EXCEEDED: ResponseStatus.TIMED_OUT,
}


class BenchError(Exception):
    """The server cannot be benchmarked as asked (unreachable, unknown model)."""


def sample_tensors(metadata: Mapping[str, Any], seed: int = 0) -> list[tuple[str, str, list[int], bytes]]:
    """(name, datatype, shape, raw bytes) of one sample per input, from the model's metadata."""
    rng = np.random.default_rng(seed)
    tensors = []
    for spec in metadata["inputs"]:
        shape = [1 if d < 0 else int(d) for d in spec["shape"]]
        dtype = numpy_dtype(spec["datatype"])
        if dtype.kind == "f":
            values = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            values = rng.integers(0, 2, shape).astype(dtype)
        else:
            values = rng.integers(0, 100, shape).astype(dtype)
        tensors.append((spec["name"], spec["datatype"], shape, values.tobytes()))
    return tensors


class HttpSender:
    def __init__(self, url: str, headers: Mapping[str, str] | None = None) -> None:
        self._base = url if url.startswith("http") else f"http://{url}"
        self._headers = dict(headers or {})
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        self._inputs: dict[str, list[tuple[str, str, list[int], bytes]]] = {}
        self._bodies: dict[tuple[str, int], tuple[bytes, str]] = {}

    async def prepare(self, models: Sequence[str]) -> None:
        for model in models:
            async with self._session.get(f"{self._base}/v2/models/{model}", headers=self._headers) as response:
                if response.status != 200:
                    raise BenchError(f"{self._base}: model {model!r}: HTTP {response.status} {await response.text()}")
                self._inputs[model] = sample_tensors(await response.json())

    def _body(self, model: str, slo_ns: int) -> tuple[bytes, str]:
        body = self._bodies.get((model, slo_ns))
        if body is None:
            tensors = self._inputs[model]
            header = json.dumps({
                "parameters": {"timeout": slo_ns // 1000, "binary_data_output": True},
                "inputs": [{"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(raw)}}
                           for n, d, s, raw in tensors],
            }).encode()  # fmt: skip
            body = self._bodies[(model, slo_ns)] = (header + b"".join(t[3] for t in tensors), str(len(header)))
        return body

    async def send(self, model: str, slo_ns: int) -> tuple[ResponseStatus, str]:
        data, header_length = self._body(model, slo_ns)
        headers = {**self._headers, HEADER_LENGTH: header_length, "Content-Type": "application/octet-stream"}
        async with self._session.post(f"{self._base}/v2/models/{model}/infer", data=data, headers=headers) as response:
            raw = await response.read()
            if response.status == 200:
                return ResponseStatus.SUCCESS, ""
            return _HTTP_STATUS.get(response.status, ResponseStatus.ERROR), _reason(response.status, raw)

    async def close(self) -> None:
        await self._session.close()


def _reason(status: int, raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        return f"HTTP {status}"
    if isinstance(body, dict):
        return str(body.get("outcome") or body.get("error") or f"HTTP {status}")[:200]
    return f"HTTP {status}"


class GrpcSender:
    def __init__(self, url: str, headers: Mapping[str, str] | None = None) -> None:
        options = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]
        self._channel = grpc.aio.insecure_channel(url.removeprefix("grpc://"), options=options)
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self._metadata = tuple((k.lower(), v) for k, v in (headers or {}).items())
        self._requests: dict[tuple[str, int], Any] = {}
        self._inputs: dict[str, list[tuple[str, str, list[int], bytes]]] = {}

    async def prepare(self, models: Sequence[str]) -> None:
        for model in models:
            try:
                meta = await self._stub.ModelMetadata(pb.ModelMetadataRequest(name=model), metadata=self._metadata)
            except grpc.aio.AioRpcError as error:
                raise BenchError(f"model {model!r}: {error.code().name} {error.details()}") from None
            inputs = [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs]
            self._inputs[model] = sample_tensors({"inputs": inputs})

    def _request(self, model: str, slo_ns: int) -> Any:
        request = self._requests.get((model, slo_ns))
        if request is None:
            tensors = self._inputs[model]
            request = pb.ModelInferRequest(model_name=model)
            request.parameters["timeout"].int64_param = slo_ns // 1000
            for name, datatype, shape, raw in tensors:
                request.inputs.add(name=name, datatype=datatype, shape=shape)
                request.raw_input_contents.append(raw)
            self._requests[(model, slo_ns)] = request
        return request

    async def send(self, model: str, slo_ns: int) -> tuple[ResponseStatus, str]:
        try:
            await self._stub.ModelInfer(self._request(model, slo_ns), metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            trailing = dict(error.trailing_metadata() or ())
            reason = str(trailing.get("mainspring-outcome") or error.details() or error.code().name)[:200]
            return _GRPC_STATUS.get(error.code(), ResponseStatus.ERROR), reason
        return ResponseStatus.SUCCESS, ""

    async def close(self) -> None:
        await self._channel.close()
