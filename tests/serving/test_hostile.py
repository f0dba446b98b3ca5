"""A server exposed to clients that should not be trusted: a token guards what changes the server
(and, when asked, everything but health), limits bound what one request may be, model names cannot
leave the repository, and a worker must hold the secret to join. Real processes on loopback."""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import schemathesis
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import HealthCheck, settings
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import Case
from schemathesis.checks import content_type_conformance, response_schema_conformance, status_code_conformance
from schemathesis.schemas import BaseSchema
from tritonclient.utils import InferenceServerException

from mainspring.frontend.openapi import openapi_document
from mainspring.models.repository import ModelRepository
from tests.serving.processes import ServerProcess, http_call, start_worker
from tests.waiting import wait_for

TOKEN = "t0ken-for-tests"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "worker-secret-for-tests"
LIMITS = {
    "MAINSPRING_MAX_BODY_BYTES": str(1024 * 1024),
    "MAINSPRING_MAX_HEADER_BYTES": "4096",
    "MAINSPRING_MAX_INPUTS": "4",
    "MAINSPRING_MAX_ELEMENTS": "100000",
    "MAINSPRING_MAX_STRING_BYTES": "256",
    "MAINSPRING_MAX_JSON_DEPTH": "8",
}
MLP_INPUT = {"name": "input", "datatype": "FP32", "shape": [1, 256], "data": [0.5] * 256}


@pytest.fixture(scope="module")
def server(small_zoo: ModelRepository, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("hostile")
    shutil.copytree(small_zoo.root, folder / "repo")
    shutil.copytree(small_zoo.root / "mlp", folder / "outside" / "escape")
    config = folder / "outside" / "escape" / "1" / "config.json"
    config.write_text(config.read_text().replace('"name": "mlp"', '"name": "escape"'))
    (folder / "repo" / "escape").symlink_to(folder / "outside" / "escape")
    env = {"MAINSPRING_AUTH_TOKEN": TOKEN, "MAINSPRING_AUTH_INFERENCE": "true", "MAINSPRING_WORKER_SECRET": SECRET}
    process = ServerProcess(folder / "repo", folder / "server.log", "--slo-ms", "30000", env={**env, **LIMITS})
    try:
        process.wait_ready()  # the local worker joined through the secret's CURVE channel
        yield process
    finally:
        assert process.stop() == 0, (folder / "server.log").read_text()


def call(server: ServerProcess, path: str, body: bytes | None = None, **headers: str) -> tuple[int, str]:
    status, raw = http_call(f"http://{server.http}{path}", body, {**BEARER, **headers})
    return status, json.loads(raw)["error"] if raw.startswith(b"{") and status != 200 else raw.decode()


def infer(server: ServerProcess, document: object) -> tuple[int, str]:
    return call(server, "/v2/models/mlp/infer", json.dumps(document).encode())


def test_the_token_guards_everything_but_health(server: ServerProcess) -> None:
    body = json.dumps({"inputs": [MLP_INPUT]}).encode()
    url = f"http://{server.http}"
    assert http_call(f"{url}/v2/health/ready")[0] == 200 and http_call(f"{url}/v2/models/mlp/ready")[0] == 200
    for path, data in (("/v2/models/mlp/infer", body), ("/v2/repository/index", b"{}"), ("/v2/models/mlp", None),
                       ("/metrics", None), ("/v2/repository/models/mlp/unload", b"{}")):  # fmt: skip
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            status, answer = http_call(url + path, data, headers)
            assert status == 401 and b"bearer token" in answer, (path, headers)
    assert call(server, "/v2/models/mlp/infer", body)[0] == 200

    http = httpclient.InferenceServerClient(server.http)
    tensor = httpclient.InferInput("input", [1, 256], "FP32")
    tensor.set_data_from_numpy(np.full((1, 256), 0.5, np.float32))
    with pytest.raises(InferenceServerException) as refused:
        http.infer("mlp", [tensor])
    assert refused.value.status() == "401"
    # A copy: tritonclient adds its own headers to the dict it is given.
    assert http.infer("mlp", [tensor], headers=dict(BEARER)).as_numpy("logits").shape == (1, 10)

    grpc = grpcclient.InferenceServerClient(server.grpc)
    assert grpc.is_server_ready()  # health needs no token
    grpc_tensor = grpcclient.InferInput("input", [1, 256], "FP32")
    grpc_tensor.set_data_from_numpy(np.full((1, 256), 0.5, np.float32))
    for headers in (None, {"authorization": "Bearer wrong"}):
        with pytest.raises(InferenceServerException) as unauthenticated:
            grpc.infer("mlp", [grpc_tensor], headers=headers)
        assert "UNAUTHENTICATED" in str(unauthenticated.value.status())
    with pytest.raises(InferenceServerException) as unauthenticated:
        grpc.unload_model("mlp")
    assert "UNAUTHENTICATED" in str(unauthenticated.value.status())
    answer = grpc.infer("mlp", [grpc_tensor], headers={"authorization": f"Bearer {TOKEN}"})
    assert answer.as_numpy("logits").shape == (1, 10)
    for headers in (None, {"authorization": f"Bearer {TOKEN}"}):  # the stream too: refused, then answered
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        grpc.start_stream(callback=lambda result, error, put=answers.put: put((result, error)), headers=headers)
        with contextlib.suppress(InferenceServerException):  # a refused stream may be closed already
            grpc.async_stream_infer("mlp", [grpc_tensor], request_id="s")
        result, error = answers.get(timeout=60)
        grpc.stop_stream()
        if headers is None:
            assert result is None and "UNAUTHENTICATED" in str(error)
        else:
            assert error is None and result.as_numpy("logits").shape == (1, 10)


@pytest.mark.parametrize(
    ("document", "status", "setting"),
    [
        ({"inputs": [MLP_INPUT] * 5}, 400, "max_inputs"),
        ({"inputs": [MLP_INPUT], "outputs": [{"name": "logits"}] * 5}, 400, "max_inputs"),
        ({"inputs": [{**MLP_INPUT, "shape": [400, 256], "data": [0.5] * 102_400}]}, 400, "max_elements"),
        ({"inputs": [{**MLP_INPUT, "shape": [1, 10**15]}]}, 400, "max_elements"),
        ({"id": "x" * 300, "inputs": [MLP_INPUT]}, 400, "max_string_bytes"),
        ({"inputs": [MLP_INPUT], "parameters": {"a": [[[[[[[[1]]]]]]]]}}, 400, "max_json_depth"),
        ({"inputs": [{**MLP_INPUT, "shape": [1, 256 * 1024], "data": [0.5] * 256 * 1024}]}, 413, "max_body_bytes"),
    ],
    ids=["inputs", "outputs", "values", "shape", "string", "depth", "body"],
)
def test_a_request_past_a_limit_is_refused_naming_the_setting(
    server: ServerProcess, document: object, status: int, setting: str
) -> None:
    answer = infer(server, document)
    assert answer[0] == status and setting in answer[1], answer


def test_oversized_headers_and_messages_are_refused_and_the_server_serves_on(server: ServerProcess) -> None:
    status, _ = http_call(f"http://{server.http}/v2/health/ready", None, {"X-Padding": "x" * 8192})
    assert 400 <= status < 500 or status == -1  # aiohttp answers 400 or closes the connection
    grpc = grpcclient.InferenceServerClient(server.grpc)
    big = grpcclient.InferInput("input", [1100, 256], "FP32")  # 1.1 MB, over the 1 MiB limit
    big.set_data_from_numpy(np.zeros((1100, 256), np.float32))
    with pytest.raises(InferenceServerException) as exhausted:
        grpc.infer("mlp", [big], headers={"authorization": f"Bearer {TOKEN}"})
    assert "RESOURCE_EXHAUSTED" in str(exhausted.value.status())
    assert infer(server, {"inputs": [MLP_INPUT]})[0] == 200


@pytest.mark.parametrize("name", ["..%2F..%2Fetc", "%2E%2E", "escape", "mlp%2F1"])
def test_the_repository_api_loads_nothing_from_outside_the_repository(server: ServerProcess, name: str) -> None:
    status, _ = call(server, f"/v2/repository/models/{name}/load", b"{}")
    assert status in (400, 404)
    _, index = call(server, "/v2/repository/index", b"{}")
    assert "escape" not in {m["name"] for m in json.loads(index)}  # the symbolic link to a folder outside


def workers(server: ServerProcess) -> float:
    _, text = call(server, "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return families["mainspring_workers"].samples[0].value


@pytest.mark.slow
def test_only_a_worker_with_the_secret_joins(server: ServerProcess, small_zoo: ModelRepository, tmp_path: Path) -> None:
    refusals = server.log.read_text().count("failed the handshake")
    stray = start_worker(server.worker_address, small_zoo.root, "stray", tmp_path / "stray.log",
                         env={"MAINSPRING_WORKER_SECRET": "a guess"})  # fmt: skip
    friend = None
    try:
        # Until it has tried: the server reports the handshake it refused (a worker starts slowly on a busy machine).
        wait_for(lambda: server.log.read_text().count("failed the handshake") > refusals or stray.poll() is not None)
        assert stray.poll() is None and workers(server) == 1 and "worker stray joined" not in server.log.read_text()
        friend = start_worker(server.worker_address, small_zoo.root, "friend", tmp_path / "friend.log",
                              env={"MAINSPRING_WORKER_SECRET": SECRET})  # fmt: skip
        wait_for(lambda: workers(server) == 2)
    finally:
        for process in (stray, friend):
            if process is not None:
                process.terminate()
                process.wait(30)


# JSON's float extremes (no inf or NaN: JSON has none; the gRPC and decoder tests send those).
FLOAT_EXTREMES = [1e308, -1e308, 1.8e305, 1.7e302, -0.0, 5e-324, -5]


def fuzzed_schema() -> BaseSchema:
    """The served OpenAPI document, with model names drawn from the repository as well as at random, and
    every numeric inference parameter from the float extremes as well."""
    document = openapi_document()
    for path in document["paths"].values():
        for operation in path.values():
            for parameter in operation.get("parameters", ()):
                if parameter["name"] == "model":
                    parameter["schema"] = {"anyOf": [{"enum": ["mlp", "resnet18", "bert_tiny"]}, {"type": "string"}]}
    parameters = document["components"]["schemas"]["InferRequest"]["properties"]["parameters"]["properties"]
    for name, schema in parameters.items():
        if schema.get("type") in ("number", "integer"):
            parameters[name] = {"anyOf": [{"enum": FLOAT_EXTREMES}, schema]}
    schema = schemathesis.openapi.from_dict(document)
    schema.config.generation.update(modes=list(schemathesis.GenerationMode))  # valid and invalid requests
    return schema


SCHEMA = fuzzed_schema()


@SCHEMA.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_answers_every_generated_request_as_its_document_says(server: ServerProcess, case: Case) -> None:
    """Every request schemathesis builds from the document, valid or not, gets a status the document
    lists and a body of its schema; never a 5xx other than those the document names for inference."""
    checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
    response = case.call_and_validate(base_url=f"http://{server.http}", headers=dict(BEARER), checks=checks)
    assert response.status_code < 500 or case.path.endswith("/infer"), (response.status_code, response.text)
