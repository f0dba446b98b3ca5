"""OpenTelemetry traces (``otlp_endpoint``): a call sent with a W3C ``traceparent`` reaches a real OTLP/HTTP
receiver on loopback, which decodes the protobuf, as a span under the client's span, with the policy's
admission and the action that ran it on the worker as children, carrying the predicted and actual times."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from mainspring.controller.service import ControllerService
from mainspring.frontend.dataplane import DataPlane, Tensor
from mainspring.serving.config import load_config
from mainspring.telemetry.tracing import Tracing, parent_context
from mainspring.transport.frontend_messages import Submit, decode_frontend
from mainspring.worker.inprocess import InProcessWorker
from tests.controller.test_service import with_service
from tests.fakes import profile
from tests.frontend.test_connections import on_frontends
from tests.serving.processes import http_call
from tests.telemetry.otlp_receiver import OtlpReceiver, ReceivedSpan

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
SERVER_KIND = 2  # the protobuf's SPAN_KIND_SERVER
ERROR = 2  # STATUS_CODE_ERROR
ONE_ROW = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3], "data": [1.0, 2.0, 3.0]}]}
PROFILES = {
    "a": profile("a", exec_ms={1: 1.0, 2: 1.5, 4: 2.0}, load_ms=2),
    "slow": profile("slow", exec_ms={1: 50.0}, load_ms=2),  # no 5 ms SLO can be met
}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    collector = OtlpReceiver()
    yield collector
    collector.close()


def traced_service(
    tracing: Tracing, test: Callable[[ControllerService, int, int], Awaitable[None]], **options: Any
) -> None:
    """``test(service, http_port, grpc_port)``: HTTP and gRPC frontends that trace, before a live service that
    traces (one process, one tracer), with an emulated worker of two devices serving ``PROFILES``."""

    async def serve(service: ControllerService, _: DataPlane, __: InProcessWorker) -> None:
        await on_frontends(service, DataPlane(service, tracing=tracing), test)

    try:
        with_service(serve, profiles=PROFILES, tracing=tracing, **options)
    finally:
        tracing.close()  # what is still batched goes out


async def post(port: int, model: str = "a", headers: dict[str, str] | None = None, **parameters: Any) -> int:
    body = json.dumps({**ONE_ROW, "parameters": parameters}).encode()
    url = f"http://127.0.0.1:{port}/v2/models/{model}/infer"
    status, _ = await asyncio.to_thread(http_call, url, body, {"Content-Type": "application/json", **(headers or {})})
    return status


def tree(spans: list[ReceivedSpan]) -> tuple[ReceivedSpan, list[ReceivedSpan], list[ReceivedSpan]]:
    """The request's span and its admission and action children (each span's parent is in the list)."""
    (request,) = [s for s in spans if s.name.startswith("infer ") and s.kind == SERVER_KIND]
    children = [s for s in spans if s.parent_span_id == request.span_id]
    assert len(children) == len(spans) - 1, [s.name for s in spans]
    admissions = [s for s in children if s.name == "admission"]
    actions = [s for s in children if s.name.startswith("infer on device")]
    assert len(admissions) + len(actions) == len(children)
    return request, admissions, actions


def test_a_call_with_a_traceparent_is_a_span_tree_with_the_prediction_beside_what_happened(
    receiver: OtlpReceiver,
) -> None:
    async def test(_: ControllerService, http_port: int, __: int) -> None:
        assert await post(http_port) == 200  # untraced (ratio 0, no traceparent): the model is loaded by then
        assert await post(http_port, headers={"traceparent": TRACEPARENT}) == 200

    traced_service(Tracing(receiver.url, 0.0, "controller"), test)
    assert {span.trace_id for span in receiver.spans} == {TRACE_ID}  # the untraced call left none
    request, (admission,), (action,) = tree(receiver.of_trace(TRACE_ID))
    assert request.parent_span_id == CLIENT_SPAN and request.name == "infer a"
    assert request.attributes["mainspring.outcomes"] == ["served"] and request.status_code != ERROR
    assert request.resource["service.name"] == "mainspring"

    decision = admission.attributes
    assert decision["mainspring.decision"] == "admitted"
    predicted = decision["mainspring.predicted_completion_unix_ns"]  # a batch of one on the device holding it
    assert request.start_ns <= predicted <= decision["mainspring.deadline_unix_ns"]
    assert 0 < decision["mainspring.predicted_after_arrival_ms"] < 500

    ran = action.attributes
    assert ran["mainspring.batch_size"] == 1 and ran["mainspring.batch_requests"] == 1
    assert ran["mainspring.device"] in (0, 1) and ran["mainspring.model"] == "a" and ran["mainspring.status"] == "ok"
    earliest, latest = ran["mainspring.window.earliest_unix_ns"], ran["mainspring.window.latest_unix_ns"]
    begin, end = ran["mainspring.actual.start_unix_ns"], ran["mainspring.actual.end_unix_ns"]
    assert earliest <= begin <= latest and begin < end  # it started inside its window
    assert ran["mainspring.predicted.start_unix_ns"] < ran["mainspring.predicted.end_unix_ns"]
    assert (action.start_ns, action.end_ns) == (begin, end)
    # Exact emulated devices: the batch took what the profile said, whenever it started.
    assert end - begin == ran["mainspring.predicted.end_unix_ns"] - ran["mainspring.predicted.start_unix_ns"]
    slack_ns = 1_000_000  # the two processes' clocks are put on the epoch separately
    assert request.start_ns - slack_ns <= begin and end <= request.end_ns + slack_ns


def test_a_rejected_call_has_an_admission_span_with_the_outcome_and_reason_and_no_action(
    receiver: OtlpReceiver,
) -> None:
    async def test(_: ControllerService, http_port: int, __: int) -> None:
        assert await post(http_port, "slow", headers={"traceparent": TRACEPARENT}, slo_ms=5) == 503

    traced_service(Tracing(receiver.url, 0.0, "controller"), test)
    request, (admission,), actions = tree(receiver.of_trace(TRACE_ID))
    assert actions == [] and request.status_code == ERROR
    assert request.attributes["mainspring.outcomes"] == ["deadline_at_arrival"]
    assert admission.attributes["mainspring.decision"] == "rejected"
    assert admission.attributes["mainspring.outcome"] == "deadline_at_arrival"
    assert "deadline cannot be met" in admission.attributes["mainspring.reason"]
    assert admission.status_code == ERROR


def test_grpc_metadata_carries_the_traceparent_and_a_malformed_or_unsampled_one_changes_nothing_else(
    receiver: OtlpReceiver,
) -> None:
    request = pb.ModelInferRequest(model_name="a")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 3])
    request.raw_input_contents.append(np.ones((1, 3), np.float32).tobytes())

    def grpc_infer(port: int, traceparent: str) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=(("traceparent", traceparent),))

    async def test(_: ControllerService, http_port: int, grpc_port: int) -> None:
        await asyncio.to_thread(grpc_infer, grpc_port, TRACEPARENT)
        unsampled = f"00-{'1' * 32}-{CLIENT_SPAN}-00"  # the client chose not to trace this one
        for malformed in ("00-xyz", f"ff-{TRACE_ID}-{CLIENT_SPAN}-01", f"00-{'0' * 32}-{CLIENT_SPAN}-01", unsampled):
            assert await post(http_port, headers={"traceparent": malformed}) == 200
        await asyncio.to_thread(grpc_infer, grpc_port, "not a traceparent")

    traced_service(Tracing(receiver.url, 1.0, "controller"), test)
    grpc_request, admissions, actions = tree(receiver.of_trace(TRACE_ID))
    assert grpc_request.parent_span_id == CLIENT_SPAN and len(admissions) == 1 and len(actions) == 1
    assert not receiver.of_trace("1" * 32)  # unsampled by its client: not traced, whatever the ratio
    roots = [s for s in receiver.spans if s.trace_id != TRACE_ID and s.parent_span_id == ""]
    assert len(roots) == 4  # each malformed one ignored: a trace of its own (ratio 1)
    for root in roots:
        assert root.trace_id != "0" * 32 and tree(receiver.of_trace(root.trace_id))[0] == root


def test_a_frontend_in_another_process_hands_its_span_to_the_controller_in_submit(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """The frontend process's channel (``RemoteController``, ``FrontendHub``: ZeroMQ ipc, as ``serve
    --frontends N`` uses), each side with a tracer of its own: the controller's spans are children of the
    frontend's."""
    from mainspring.controller.frontends import FrontendHub
    from mainspring.frontend.remote import RemoteController

    frontend_tracing = Tracing(receiver.url, 0.0, "frontend-1")

    async def test(service: ControllerService, _: DataPlane, __: InProcessWorker) -> None:
        hub = FrontendHub(service, f"ipc://{tmp_path}/frontends")
        await hub.start()
        remote = RemoteController(hub.endpoint, "frontend-1")
        await remote.start(timeout_s=30)
        try:
            plane = DataPlane(remote, tracing=frontend_tracing)
            row = [Tensor("input", "FP32", [1, 3], np.ones((1, 3), np.float32))]
            for headers in ({}, {"traceparent": TRACEPARENT}):  # the first loads the model, untraced
                await plane.infer("a", None, row, None, {}, headers=headers)
        finally:
            await remote.close()
            await hub.close()

    controller_tracing = Tracing(receiver.url, 0.0, "controller")
    try:
        with_service(test, profiles=PROFILES, tracing=controller_tracing)
    finally:
        frontend_tracing.close()
        controller_tracing.close()
    request, (admission,), (action,) = tree(receiver.of_trace(TRACE_ID))
    assert request.resource["service.instance.id"] == "frontend-1" and request.parent_span_id == CLIENT_SPAN
    assert admission.resource["service.instance.id"] == action.resource["service.instance.id"] == "controller"
    assert (
        action.attributes["mainspring.actual.start_unix_ns"] >= action.attributes["mainspring.window.earliest_unix_ns"]
    )


@given(st.one_of(st.text(max_size=80), st.from_regex(r"[0-9a-f]{2}-[0-9a-fA-F]{32}-[0-9a-f]{16}-[0-9a-f]{2}.{0,3}")))
def test_whatever_a_client_sends_as_traceparent_is_a_valid_parent_or_ignored(text: str) -> None:
    context = parent_context({"traceparent": text})
    if context is not None:  # then it names the ids it carried
        span = trace.get_current_span(context).get_span_context()
        assert f"{span.trace_id:032x}" == text[3:35].lower() and f"{span.span_id:016x}" == text[36:52]


def test_a_submit_from_a_frontend_that_predates_tracing_still_decodes() -> None:
    class OldSubmit(msgspec.Struct, frozen=True, tag="Submit"):
        call: int
        model: str
        slo_ns: int
        inputs: list[list[Any]]
        waited_ns: int = 0

    message, _ = decode_frontend([msgspec.msgpack.encode(OldSubmit(7, "a", 100, []))])
    assert isinstance(message, Submit) and message.traceparent == "" and message.call == 7


def test_with_tracing_off_serving_imports_no_opentelemetry() -> None:
    code = (
        "import sys\n"
        "from mainspring.serving.server import Server\n"
        "from mainspring.serving.config import ServeConfig\n"
        "import mainspring.frontend.process, mainspring.frontend.http, mainspring.frontend.grpc\n"
        "Server(ServeConfig(devices='cpu'))\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MAINSPRING_TRACE_SAMPLE_RATIO": "1.5"}, "trace_sample_ratio=1.5 must lie in [0, 1]"),
        ({"MAINSPRING_TRACE_SAMPLE_RATIO": "nan"}, "trace_sample_ratio=nan must be a finite number"),
        ({"MAINSPRING_OTLP_ENDPOINT": "collector:4318"}, "otlp_endpoint='collector:4318' must be an http:// or"),
    ],
)
def test_bad_tracing_settings_name_the_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_config(None, env, {})


def test_an_endpoint_without_a_path_gets_the_otlp_traces_path() -> None:
    from mainspring.telemetry.tracing import traces_url

    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://otel.example/custom/traces") == "https://otel.example/custom/traces"
    config = load_config(None, {"MAINSPRING_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, {})
    assert config.otlp_endpoint == "http://127.0.0.1:4318" and config.trace_sample_ratio == 1.0
