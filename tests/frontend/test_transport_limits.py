"""What a hostile or careless client sends gets the same clear refusal over HTTP and gRPC, for that
request alone: numbers past any range, strings past ``max_string_bytes``, messages past
``max_body_bytes``, a tensor given twice. Real HTTP and gRPC servers on loopback."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from mainspring.controller.service import ControllerService
from tests.frontend.test_connections import with_frontends
from tests.serving.processes import http_call

ROW = [1.0, 2.0, 3.0]
EXTREMES = [1e308, -1e308, 1.8e305, 1.7e302, -0.0, -5]  # what JSON can carry; gRPC adds inf and NaN
MIB = 1024 * 1024


def http_infer(port: int, document: dict[str, Any] | bytes, model: str = "a") -> tuple[int, str]:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    status, raw = http_call(f"http://127.0.0.1:{port}/v2/models/{model}/infer", body)
    return status, json.loads(raw)["error"] if status != 200 else ""


def document(**parameters: Any) -> dict[str, Any]:
    return {"parameters": parameters, "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3], "data": ROW}]}


def grpc_request(rows: int = 1, model: str = "a", request_id: str = "", **parameters: Any) -> Any:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="input", datatype="FP32", shape=[rows, 3])
    request.raw_input_contents.append(np.ones((rows, 3), np.float32).tobytes())
    for key, value in parameters.items():
        if isinstance(value, str):
            request.parameters[key].string_param = value
        elif isinstance(value, float):
            request.parameters[key].double_param = value
        else:
            request.parameters[key].int64_param = value
    return request


def grpc_call(port: int, method: str, request: Any) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]) as channel:
        try:
            getattr(pb_grpc.GRPCInferenceServiceStub(channel), method)(request, timeout=60)
        except grpc.RpcError as error:
            return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def grpc_stream(port: int, requests: list[Any]) -> list[Any]:
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]) as channel:
        return list(pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(requests), timeout=60))


def test_every_out_of_range_slo_is_a_400_naming_it_over_both_transports() -> None:
    async def test(_: ControllerService, http: int, grpc_port: int) -> None:
        for key in ("slo_ms", "timeout"):
            for value in EXTREMES:
                if key == "timeout" and value == 0:  # -0.0: Triton's "no timeout"
                    continue
                status, error = await asyncio.to_thread(http_infer, http, document(**{key: value}))
                assert status == 400 and repr(key) in error, (key, value, status, error)
                grpc_value = float(value) if key == "slo_ms" else int(value) if abs(value) < 2**63 else float(value)
                code, details = await asyncio.to_thread(grpc_call, grpc_port, "ModelInfer",
                                                        grpc_request(**{key: grpc_value}))  # fmt: skip
                assert code == grpc.StatusCode.INVALID_ARGUMENT and repr(key) in details, (key, value, code, details)
            for value in (math.inf, -math.inf, math.nan):
                code, details = await asyncio.to_thread(grpc_call, grpc_port, "ModelInfer",
                                                        grpc_request(**{key: value}))  # fmt: skip
                assert code == grpc.StatusCode.INVALID_ARGUMENT and repr(key) in details, (key, value, code, details)
        # JSON's number past a double: refused as the body's
        raw = json.dumps(document(slo_ms=1)).replace('"slo_ms": 1', '"slo_ms": 1e400').encode()
        status, error = await asyncio.to_thread(http_infer, http, raw)
        assert status == 400 and "Number out of range" in error, error
        # a parameter that another overrides is checked all the same
        status, error = await asyncio.to_thread(http_infer, http, document(slo_ms=200, timeout=-5))
        assert status == 400 and "'timeout'" in error, error
        both = grpc_request(slo_ms=200.0, timeout=-5)
        code, details = await asyncio.to_thread(grpc_call, grpc_port, "ModelInfer", both)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "'timeout'" in details, details
        assert await asyncio.to_thread(http_infer, http, document(slo_ms=200, timeout=0)) == (200, "")
        assert await asyncio.to_thread(http_infer, http, document(timeout=-0.0)) == (200, "")
        status, error = await asyncio.to_thread(http_infer, http, document(slo_ms=5e-324))  # positive: unmeetable
        assert status == 503 and "deadline cannot be met" in error, error

    with_frontends(test)


def test_an_http_input_with_both_data_and_binary_data_is_refused_as_over_grpc() -> None:
    async def test(_: ControllerService, http: int, grpc_port: int) -> None:
        header = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3], "data": ROW,
                                         "parameters": {"binary_data_size": 12}}]}).encode()  # fmt: skip
        body = header + np.ones(3, np.float32).tobytes()
        status, raw = await asyncio.to_thread(
            http_call, f"http://127.0.0.1:{http}/v2/models/a/infer", body,
            {"Inference-Header-Content-Length": str(len(header))},
        )  # fmt: skip
        assert status == 400 and "binary_data_size" in json.loads(raw)["error"], raw
        request = grpc_request()
        request.inputs[0].contents.fp32_contents.extend(ROW)
        code, details = await asyncio.to_thread(grpc_call, grpc_port, "ModelInfer", request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "raw_input_contents" in details, details

    with_frontends(test)


def test_strings_past_max_string_bytes_are_refused_over_grpc_as_over_http() -> None:
    async def test(_: ControllerService, http: int, grpc_port: int) -> None:
        long_id = "x" * 100_000
        status, error = await asyncio.to_thread(http_infer, http, {**document(), "id": long_id})
        assert status == 400 and "max_string_bytes" in error, error
        for request in (grpc_request(request_id=long_id), grpc_request(note="y" * 5000),
                        grpc_request(**{"k" * 5000: 1})):  # fmt: skip
            code, details = await asyncio.to_thread(grpc_call, grpc_port, "ModelInfer", request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_string_bytes" in details, details
        # A name too long to echo: refused by its length, not echoed until the answer outgrows gRPC's metadata.
        name = "m" * 17_000
        for method, request in (("ModelInfer", grpc_request(model=name)), ("ModelMetadata",
                                pb.ModelMetadataRequest(name=name))):  # fmt: skip
            code, details = await asyncio.to_thread(grpc_call, grpc_port, method, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_string_bytes" in details, (method, code)
            assert len(details) < 1000
        status, error = await asyncio.to_thread(http_infer, http, document(), "m" * 10_000)
        assert status == 400 and "max_string_bytes" in error and len(error) < 1000, error
        # Under the limit, an unknown name is quoted in its answer, cut short.
        code, details = await asyncio.to_thread(grpc_call, grpc_port, "ModelInfer", grpc_request(model="n" * 4000))
        assert code == grpc.StatusCode.NOT_FOUND and len(details) <= 1000
        assert details.startswith("Request for unknown model: 'nnn")

    with_frontends(test)


def test_a_message_over_max_body_bytes_is_refused_alone_and_the_stream_goes_on() -> None:
    rows_over_one_mib = MIB // 12 + 100  # FP32 rows of three values: just over 1 MiB

    async def test(_: ControllerService, http: int, grpc_port: int) -> None:
        big = grpc_request(rows=rows_over_one_mib)
        code, details = await asyncio.to_thread(grpc_call, grpc_port, "ModelInfer", big)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_body_bytes" in details, details
        requests = [grpc_request(request_id="0"), grpc_request(rows=rows_over_one_mib, request_id="1"),
                    grpc_request(request_id="2")]  # fmt: skip
        answers = await asyncio.to_thread(grpc_stream, grpc_port, requests)
        assert len(answers) == 3, answers
        by_id = {a.infer_response.id: a.error_message for a in answers}
        assert by_id["0"] == by_id["2"] == "" and "max_body_bytes" in by_id["1"], by_id
        # Past twice the limit, gRPC itself ends the call, with the same code (never INTERNAL).
        huge = grpc_request(rows=3 * rows_over_one_mib)
        with pytest.raises(grpc.RpcError) as ended:
            await asyncio.to_thread(grpc_stream, grpc_port, [grpc_request(), huge, grpc_request()])
        assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    with_frontends(test, max_body_bytes=MIB)
