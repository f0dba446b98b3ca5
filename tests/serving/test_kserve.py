"""The real server on loopback, used through the unmodified ``tritonclient`` (HTTP and gRPC) and raw HTTP."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from mainspring.models.loading import export_zoo_model
from mainspring.models.repository import ModelRepository
from mainspring.models.zoo import build_model
from mainspring.telemetry.analyze import analyze, runs
from tests.serving.processes import ServerProcess, http_call
from tests.serving.test_supervision import metric
from tests.torch_models import RESNET_ARGS
from tests.waiting import wait_for

ARGS = {"mlp": {}, "resnet18": RESNET_ARGS, "bert_tiny": {}}


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="module")
def server(
    small_zoo: ModelRepository, tmp_path_factory: pytest.TempPathFactory, log_dir: Path
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("serve")
    shutil.copytree(small_zoo.root, folder / "repo")
    # These tests check answers, not latency: a generous SLO (a CI machine once stalled 3.7 s).
    process = ServerProcess(folder / "repo", folder / "server.log", "--slo-ms", "30000", "--log-dir", str(log_dir))
    try:
        process.wait_ready()
        yield process
    finally:
        assert process.stop() == 0, (folder / "server.log").read_text()


@pytest.fixture
def http(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http)


@pytest.fixture
def grpc(server: ServerProcess) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc)


def reference(model: str, batch: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return build_model(model, ARGS[model])(torch.from_numpy(batch)).numpy()


def inputs_for(model: str, batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if model == "bert_tiny":
        return rng.integers(0, 1000, (batch, 32), dtype=np.int64)
    if model == "resnet18":
        return rng.standard_normal((batch, 3, 48, 48), dtype=np.float32)
    return rng.standard_normal((batch, 256), dtype=np.float32)


def test_health_and_metadata(http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient) -> None:
    assert http.is_server_live() and http.is_server_ready()
    assert grpc.is_server_live() and grpc.is_server_ready()
    assert http.get_server_metadata()["name"] == "mainspring"
    assert "model_repository" in grpc.get_server_metadata().extensions
    meta = http.get_model_metadata("resnet18")
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 48, 48]}]
    assert meta["outputs"][0]["shape"] == [-1, 1000]
    assert grpc.get_model_metadata("bert_tiny").inputs[0].datatype == "INT64"
    assert http.is_model_ready("mlp") and grpc.is_model_ready("mlp", "1") and not http.is_model_ready("mlp", "7")
    assert grpc.get_model_config("mlp").config.max_batch_size == 8
    # Triton's config fields over HTTP too (code written for Triton reads config["input"]), equal to gRPC's
    triton = {"name": "mlp", "platform": "pytorch_torch_export", "max_batch_size": 8,
              "input": [{"name": "input", "data_type": "TYPE_FP32", "dims": [256]}],
              "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10]}],
              "dynamic_batching": {"preferred_batch_size": [1, 2, 4, 8]}}  # fmt: skip
    config = http.get_model_config("mlp")
    assert {key: config[key] for key in triton} == triton
    over_grpc = grpc.get_model_config("mlp", as_json=True)["config"]
    assert [int(d) for d in over_grpc["input"][0]["dims"]] == [256]
    assert over_grpc["dynamic_batching"]["preferred_batch_size"] == [1, 2, 4, 8]


@pytest.mark.parametrize("model", ["mlp", "resnet18", "bert_tiny"])
@pytest.mark.parametrize("binary", [True, False])
def test_http_inference_equals_the_model(http: httpclient.InferenceServerClient, model: str, binary: bool) -> None:
    data = inputs_for(model, 3)
    tensor = httpclient.InferInput("input_ids" if model == "bert_tiny" else "input", list(data.shape),
                                   "INT64" if model == "bert_tiny" else "FP32")  # fmt: skip
    tensor.set_data_from_numpy(data, binary_data=binary)
    name = "pooled" if model == "bert_tiny" else "logits"
    result = http.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput(name, binary_data=binary)])
    np.testing.assert_allclose(result.as_numpy(name), reference(model, data), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model", ["mlp", "bert_tiny"])
def test_grpc_inference_equals_the_model(grpc: grpcclient.InferenceServerClient, model: str) -> None:
    data = inputs_for(model, 2, seed=5)
    tensor = grpcclient.InferInput("input_ids" if model == "bert_tiny" else "input", list(data.shape),
                                   "INT64" if model == "bert_tiny" else "FP32")  # fmt: skip
    tensor.set_data_from_numpy(data)
    result = grpc.infer(model, [tensor], client_timeout=60)
    name = "pooled" if model == "bert_tiny" else "logits"
    np.testing.assert_allclose(result.as_numpy(name), reference(model, data), rtol=1e-4, atol=1e-4)


def test_a_request_that_cannot_meet_its_slo_is_rejected_at_once(
    server: ServerProcess, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    tensor = httpclient.InferInput("input", [1, 3, 48, 48], "FP32")
    tensor.set_data_from_numpy(inputs_for("resnet18", 1))
    begin = time.monotonic()
    with pytest.raises(InferenceServerException) as rejected:
        http.infer("resnet18", [tensor], timeout=50)  # 50 microseconds: less than one batch takes
    assert rejected.value.status() == "503"
    assert time.monotonic() - begin < 5.0  # answered on arrival, not at the deadline or after running
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 256], "data": [0.0] * 256}],
                       "parameters": {"slo_ms": 0.01}}).encode()  # fmt: skip
    status, reply = http_call(f"http://{server.http}/v2/models/mlp/infer", body)
    assert status == 503 and json.loads(reply)["outcome"] == "deadline_at_arrival"
    g_tensor = grpcclient.InferInput("input", [1, 256], "FP32")
    g_tensor.set_data_from_numpy(inputs_for("mlp", 1))
    with pytest.raises(InferenceServerException) as rejected_grpc:
        grpc.infer("mlp", [g_tensor], parameters={"slo_ms": 0.01})
    assert "UNAVAILABLE" in str(rejected_grpc.value.status())
    served = grpc.infer("mlp", [g_tensor], timeout=0)  # Triton's "no timeout": the default SLO, not a 400
    assert served.as_numpy("logits").shape == (1, 10)


def top_classes(logits: np.ndarray, count: int) -> list[list[int]]:
    return [list(np.argsort(-row, kind="stable")[:count]) for row in logits]


def parse_classes(answer: np.ndarray) -> tuple[list[list[int]], np.ndarray]:
    """Classification elements (``"value:index"``; bytes from binary data) -> the indices and the values."""
    text = [[e.decode() if isinstance(e, bytes) else e for e in row] for row in answer]
    pairs = [[element.split(":") for element in row] for row in text]
    return [[int(i) for _, i in row] for row in pairs], np.array([[float(v) for v, _ in row] for row in pairs])


@pytest.mark.parametrize("binary", [True, False])
def test_classification_returns_the_top_classes(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, binary: bool
) -> None:
    """Triton's classification extension, as ``tritonclient``'s ``class_count`` asks for it."""
    data = inputs_for("mlp", 2, seed=3)
    expected = reference("mlp", data)
    tensor = httpclient.InferInput("input", [2, 256], "FP32")
    tensor.set_data_from_numpy(data)
    wanted = httpclient.InferRequestedOutput("logits", binary_data=binary, class_count=3)
    answer = http.infer("mlp", [tensor], outputs=[wanted]).as_numpy("logits")
    assert answer.shape == (2, 3)
    indices, values = parse_classes(answer)
    assert indices == top_classes(expected, 3)
    np.testing.assert_allclose(values, np.take_along_axis(expected, np.array(indices), 1), rtol=1e-4, atol=1e-4)
    remote = grpcclient.InferInput("input", [2, 256], "FP32")
    remote.set_data_from_numpy(data)
    # more classes than the output has: all of them, best first
    answer = grpc.infer("mlp", [remote], outputs=[grpcclient.InferRequestedOutput("logits", class_count=50)],
                        client_timeout=60).as_numpy("logits")  # fmt: skip
    assert answer.shape == (2, 10) and parse_classes(answer)[0] == top_classes(expected, 10)
    assert "classification" in http.get_server_metadata()["extensions"]


def test_a_grpc_stream_answers_every_request_once(grpc: grpcclient.InferenceServerClient) -> None:
    """``tritonclient``'s ``async_stream_infer``: requests run side by side and each is answered once,
    a refused one with its error, in whatever order they finish."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    sent = {}
    for i in range(12):
        data = inputs_for("mlp", 1 + i % 3, seed=i)
        tensor = grpcclient.InferInput("input", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        grpc.async_stream_infer("mlp", [tensor], request_id=f"r{i}")
        sent[f"r{i}"] = data
    wrong = grpcclient.InferInput("input", [1, 100], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 100), np.float32))
    grpc.async_stream_infer("mlp", [wrong], request_id="wrong")
    grpc.async_stream_infer("vgg", [wrong], request_id="unknown")
    served, errors = {}, []
    for _ in range(14):
        result, error = answers.get(timeout=60)
        if error is not None:
            errors.append(error.message())
        else:
            served[result.get_response().id] = result.as_numpy("logits")
    grpc.stop_stream()
    assert answers.empty()  # nothing answered twice
    assert sorted(served) == sorted(sent)
    for request_id, data in sent.items():
        np.testing.assert_allclose(served[request_id], reference("mlp", data), rtol=1e-4, atol=1e-4)
    assert sorted(errors) == [
        "Request for unknown model: 'vgg' is not found",
        "input 'input': shape [1, 100] does not match [-1, 256]",
    ]


def test_grpc_refuses_what_it_cannot_honour(grpc: grpcclient.InferenceServerClient) -> None:
    """A shared-memory region never registered, a sequence (a stateful model's request) and a bad class count:
    each named."""
    tensor = grpcclient.InferInput("input", [1, 256], "FP32")
    tensor.set_shared_memory("region0", 1024)
    with pytest.raises(InferenceServerException, match="shared memory region 'region0' is not registered"):
        grpc.infer("mlp", [tensor], client_timeout=60)
    tensor = grpcclient.InferInput("input", [1, 256], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 256), np.float32))
    wanted = grpcclient.InferRequestedOutput("logits")
    wanted.set_shared_memory("region1", 40)
    with pytest.raises(InferenceServerException, match="output 'logits': shared memory region 'region1' is not"):
        grpc.infer("mlp", [tensor], outputs=[wanted], client_timeout=60)
    with pytest.raises(InferenceServerException, match="parameter 'sequence_id': sequences are not supported"):
        grpc.infer("mlp", [tensor], sequence_id=42, sequence_start=True, client_timeout=60)
    assert grpc.infer("mlp", [tensor], client_timeout=60).as_numpy("logits").shape == (1, 10)  # sequence_id 0: none
    # Triton's priority levels: accepted (tritonclient sends a uint64), served alike, by deadline
    assert grpc.infer("mlp", [tensor], priority=2, client_timeout=60).as_numpy("logits").shape == (1, 10)
    with pytest.raises(InferenceServerException, match="classification must be a positive integer, got -2"):
        grpc.infer("mlp", [tensor], outputs=[grpcclient.InferRequestedOutput("logits", class_count=-2)])


def post(server: ServerProcess, path: str, document: object) -> tuple[int, str]:
    status, body = http_call(f"http://{server.http}{path}", json.dumps(document).encode())
    return status, json.loads(body)["error"] if status != 200 else body.decode()


MLP_INPUT = {"name": "input", "datatype": "FP32", "shape": [1, 256], "data": [0.5] * 256}


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        (
            {"inputs": [{**MLP_INPUT, "shape": [1, 128], "data": [0.5] * 128}]},
            "shape [1, 128] does not match [-1, 256]",
        ),
        ({"inputs": [{**MLP_INPUT, "datatype": "FP64"}]}, "datatype FP64 does not match FP32"),
        ({"inputs": [{**MLP_INPUT, "data": [0.5] * 10}]}, "10 values, shape [1, 256] needs 256"),
        ({"inputs": [{**MLP_INPUT, "name": "x"}]}, "unexpected input 'x'"),
        ({"inputs": []}, "inputs must be a non-empty list"),
        ({"inputs": [MLP_INPUT], "outputs": [{"name": "nope"}]}, "unknown output 'nope'"),
        ({"inputs": [MLP_INPUT], "parameters": {"slo_ms": -3}}, "parameter 'slo_ms' must be a positive number"),
        # deadlines travel to the worker as 64-bit integers: one this far off once dropped the worker
        ({"inputs": [MLP_INPUT], "parameters": {"slo_ms": 1e300}}, "parameter 'slo_ms' must be at most 86400000"),
        ({"inputs": [MLP_INPUT], "parameters": {"timeout": 2**70}}, "parameter 'timeout' must be at most 86400000000"),
        ({"inputs": [{**MLP_INPUT, "datatype": "BYTES"}]}, "unsupported datatype 'BYTES'"),
        (
            {"inputs": [MLP_INPUT], "outputs": [{"name": "logits", "parameters": {"binary_data": "false"}}]},
            "output 'logits' parameters: binary_data must be true or false, got 'false'",
        ),
        ({"inputs": [MLP_INPUT], "parameters": {"binary_data_output": 1}}, "binary_data_output must be true or false"),
        ({"id": 7, "inputs": [MLP_INPUT]}, "id must be a string, got 7"),
        (
            {"inputs": [MLP_INPUT], "parameters": {"sequence_id": 3}},
            "parameter 'sequence_id': sequences are not supported",
        ),
        ({"inputs": [MLP_INPUT], "parameters": {"priority": "high"}}, "'priority' must be a non-negative integer"),
        ({"inputs": [MLP_INPUT], "parameters": {"priority": -1}}, "'priority' must be a non-negative integer, got -1"),
        (
            {"inputs": [MLP_INPUT], "outputs": [{"name": "logits", "parameters": {"classification": 0}}]},
            "output 'logits': classification must be a positive integer, got 0",
        ),
        (
            {"inputs": [MLP_INPUT], "outputs": [{"name": "logits", "parameters": {"classification": "3"}}]},
            "classification must be a positive integer, got '3'",
        ),
        # shared memory: a placement half given, or data beside it (which is meant?), or a region never registered
        (
            {"inputs": [{**MLP_INPUT, "parameters": {"shared_memory_region": "in0"}}]},
            "input 'input': shared_memory_byte_size must be a non-negative integer",
        ),
        (
            {"inputs": [{**MLP_INPUT, "parameters": {"shared_memory_region": "in0", "shared_memory_byte_size": 4}}]},
            "input 'input': data must be left out with shared_memory_region",
        ),
        (
            {
                "inputs": [MLP_INPUT],
                "outputs": [
                    {"name": "logits", "parameters": {"shared_memory_region": "out0", "shared_memory_byte_size": 40}}
                ],
            },
            "output 'logits': shared memory region 'out0' is not registered",
        ),
    ],
)
def test_bad_requests_get_400_naming_the_problem(server: ServerProcess, document: object, fragment: str) -> None:
    status, error = post(server, "/v2/models/mlp/infer", document)
    assert status == 400 and fragment in error


def test_malformed_json_unknown_models_and_paths(server: ServerProcess, grpc: grpcclient.InferenceServerClient) -> None:
    status, body = http_call(f"http://{server.http}/v2/models/mlp/infer", b"{not json")
    assert status == 400 and "not valid JSON" in json.loads(body)["error"]
    for depth in (100_000, 1_000):  # deeper than the parser's limit; deep enough for numpy to refuse
        nested = b"[" * depth + b"0.5" + b"]" * depth
        document = b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 256], "data": ' + nested + b"}]}"
        status, body = http_call(f"http://{server.http}/v2/models/mlp/infer", document)
        assert status == 400 and "error" in json.loads(body), (depth, body[:200])
    assert post(server, "/v2/models/vgg/infer", {"inputs": [MLP_INPUT]}) == (
        404,
        "Request for unknown model: 'vgg' is not found",  # Triton's words: its clients' examples match on them
    )
    status, body = http_call(f"http://{server.http}/v2/models/vgg")
    assert status == 404 and "vgg" in json.loads(body)["error"]
    status, body = http_call(f"http://{server.http}/v2/nothing/here")
    assert status == 404 and "error" in json.loads(body)
    with pytest.raises(InferenceServerException) as missing:
        grpc.get_model_metadata("vgg")
    assert "NOT_FOUND" in str(missing.value.status())
    wrong = grpcclient.InferInput("input", [1, 100], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 100), np.float32))
    with pytest.raises(InferenceServerException) as invalid:
        grpc.infer("mlp", [wrong])
    assert "INVALID_ARGUMENT" in str(invalid.value.status()) and "[1, 100]" in invalid.value.message()
    header = json.dumps({"inputs": [{**{k: v for k, v in MLP_INPUT.items() if k != "data"},
                                     "parameters": {"binary_data_size": 1024}}]}).encode()  # fmt: skip
    for length, fragment in ((-5, "must not be negative"), (99_999, "exceeds the body"), ("abc", "an integer")):
        headers = {"Inference-Header-Content-Length": str(length), "Content-Type": "application/octet-stream"}
        status, body = http_call(f"http://{server.http}/v2/models/mlp/infer", header + bytes(1024), headers)
        assert status == 400 and fragment in json.loads(body)["error"], (length, body)
    assert http_call(f"http://{server.http}/v2/health/live")[0] == 200  # still up


def test_repository_unload_and_load(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    index = {m["name"]: m["state"] for m in http.get_model_repository_index()}
    assert index == {"mlp": "READY", "resnet18": "READY", "bert_tiny": "READY"}
    tensor = httpclient.InferInput("input_ids", [1, 32], "INT64")
    tensor.set_data_from_numpy(inputs_for("bert_tiny", 1))
    http.unload_model("bert_tiny")
    try:
        assert not http.is_model_ready("bert_tiny")
        assert {m["name"]: m["state"] for m in http.get_model_repository_index()}["bert_tiny"] == "UNAVAILABLE"
        with pytest.raises(InferenceServerException) as gone:
            http.infer("bert_tiny", [tensor])
        assert gone.value.status() == "404"
        grpc.load_model("bert_tiny")
    finally:
        if not http.is_model_ready("bert_tiny"):  # the server is shared by the module's tests
            http.load_model("bert_tiny")
    assert grpc.is_model_ready("bert_tiny")
    result = http.infer("bert_tiny", [tensor])
    np.testing.assert_allclose(result.as_numpy("pooled"), reference("bert_tiny", inputs_for("bert_tiny", 1)),
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    with pytest.raises(InferenceServerException) as unknown:
        http.load_model("vgg16")
    assert unknown.value.status() == "404"


def test_repository_calls_refuse_what_they_cannot_honour_and_filter_by_readiness(
    server: ServerProcess, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    override = json.dumps({"max_batch_size": 4})
    with pytest.raises(InferenceServerException) as refused:  # once silently ignored: the override never applied
        http.load_model("mlp", config=override)
    assert refused.value.status() == "400" and "overrides the model's config or files" in refused.value.message()
    with pytest.raises(InferenceServerException) as refused:
        grpc.load_model("mlp", config=override)
    assert "INVALID_ARGUMENT" in str(refused.value.status()) and "'config'" in refused.value.message()
    for path, body, fragment in (
        ("/v2/repository/index", b"[1]", "request body must be a JSON object"),
        ("/v2/repository/index", b"{bad", "request body is not valid JSON"),
        ("/v2/repository/index", b'{"ready": "yes"}', "ready must be true or false, got 'yes'"),
        ("/v2/repository/models/mlp/load", b'{"parameters": 5}', "parameters must be a JSON object"),
        ("/v2/repository/models/mlp/unload", b'{"parameters": {"colour": 1}}', "unknown parameter 'colour'"),
        ("/v2/repository/models/mlp/unload", b'{"parameters": {"unload_dependents": "no"}}', "must be true or"),
    ):
        status, reply = http_call(f"http://{server.http}{path}", body)
        assert status == 400 and fragment in json.loads(reply)["error"], (path, body, reply)
    assert http.is_model_ready("mlp")  # a refused unload unloads nothing
    http.unload_model("bert_tiny")  # tritonclient sends unload_dependents: false
    try:
        ready = {m["name"] for m in json.loads(http_call(f"http://{server.http}/v2/repository/index",
                                                         b'{"ready": true}')[1])}  # fmt: skip
        assert ready == {"mlp", "resnet18"}
        assert {m.name for m in grpc.get_model_repository_index().models} == {"mlp", "resnet18", "bert_tiny"}
    finally:
        http.load_model("bert_tiny")


def mlp_answers(url: str, data: np.ndarray) -> tuple[str, np.ndarray]:
    tensor = httpclient.InferInput("input", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = httpclient.InferenceServerClient(url).infer("mlp", [tensor])
    return result.get_response()["model_version"], result.as_numpy("logits")


class MlpClients:
    """Clients asking ``mlp`` back to back until the block ends: each answer's version (with when its request
    was sent: ``time.monotonic()``), each failure."""

    def __init__(self, url: str, data: np.ndarray, count: int = 1) -> None:
        self.answers: list[tuple[float, str]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._ask, args=(url, data)) for _ in range(count)]

    @property
    def versions(self) -> list[str]:
        """Each answer's version, in the order they came."""
        return [version for _, version in self.answers]

    def sent_after(self, moment: float) -> list[str]:
        """The versions that answered requests sent after ``moment`` (``time.monotonic()``)."""
        return [version for sent, version in self.answers if sent > moment]

    def _ask(self, url: str, data: np.ndarray) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                self.answers.append((sent, mlp_answers(url, data)[0]))
            except InferenceServerException as error:
                self.failures.append(f"{error.status()} {error.message()}")

    def __enter__(self) -> MlpClients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def test_a_changed_model_is_reloaded_in_place_while_it_serves(
    server: ServerProcess, http: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    """Triton's load of a loaded model: the new version serves once loaded, and no request in between fails."""
    repo, data = ModelRepository(server.repo), inputs_for("mlp", 2)
    http.load_model("mlp")  # unchanged: nothing to do
    other = ModelRepository(tmp_path)
    export_zoo_model(other, "mlp", seed=1)  # the same model with other weights, as version 2
    shutil.copytree(other.path("mlp", 1), repo.path("mlp", 1).parent / "2")
    try:
        with MlpClients(server.http, data, count=3) as clients:
            wait_for(lambda: clients.answers or clients.failures)  # served before the reload
            http.load_model("mlp")  # was: a 400 telling to unload, then load
            reloaded = time.monotonic()
            assert http.get_model_metadata("mlp")["versions"] == ["2"]
            wait_for(lambda: len(clients.sent_after(reloaded)) >= 3 or clients.failures)  # and after it
        failures, versions, after = clients.failures, clients.versions, clients.sent_after(reloaded)
        assert failures == [] and versions[0] == "1" and set(after) == {"2"}, (failures, versions)
        version, logits = mlp_answers(server.http, data)
        with torch.inference_mode():
            expected = build_model("mlp", {}, seed=1)(torch.from_numpy(data)).numpy()
        assert version == "2"
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    finally:
        shutil.rmtree(repo.path("mlp", 1).parent / "2", ignore_errors=True)
        http.load_model("mlp")  # back to version 1, in place again
    version, logits = mlp_answers(server.http, data)
    assert version == "1"
    np.testing.assert_allclose(logits, reference("mlp", data), rtol=1e-4, atol=1e-4)


def test_a_reload_that_fails_leaves_the_model_served_and_a_failed_load_is_indexed(
    server: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    repo = ModelRepository(server.repo)
    original = repo.config("bert_tiny")
    repo.write(msgspec.structs.replace(original, slo_ms=500.0))
    moved = repo.path("bert_tiny") / "moved"
    try:
        http.load_model("bert_tiny")  # the config changed: reloaded
        assert http.get_model_config("bert_tiny")["default_slo_ms"] == 500.0
        (repo.path("bert_tiny") / original.file).rename(moved)
        repo.write(original)
        with pytest.raises(InferenceServerException) as failed:
            http.load_model("bert_tiny")  # a reload that cannot load
        assert failed.value.status() == "400" and "does not exist" in failed.value.message()
        assert http.is_model_ready("bert_tiny")  # still served, as it was
        assert http.get_model_config("bert_tiny")["default_slo_ms"] == 500.0
        http.unload_model("bert_tiny")
        with pytest.raises(InferenceServerException) as failed:
            http.load_model("bert_tiny")
        assert failed.value.status() == "400"
        entry = next(m for m in http.get_model_repository_index() if m["name"] == "bert_tiny")
        assert entry["state"] == "UNAVAILABLE" and "does not exist" in entry["reason"], entry
    finally:
        if moved.exists():
            moved.rename(repo.path("bert_tiny") / original.file)
        repo.write(original)
        http.load_model("bert_tiny")
    assert http.get_model_config("bert_tiny")["default_slo_ms"] != 500.0


def test_metrics_stats_and_openapi(
    server: ServerProcess, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    tensor = httpclient.InferInput("input", [2, 256], "FP32")
    tensor.set_data_from_numpy(inputs_for("mlp", 2))
    http.infer("mlp", [tensor])
    status, body = http_call(f"http://{server.http}/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    requests = {(s.labels["model"], s.labels["outcome"]): s.value
                for s in families["mainspring_requests"].samples if s.name.endswith("_total")}  # fmt: skip
    assert requests[("mlp", "success")] >= 2
    for name in ("mainspring_goodput_requests", "mainspring_request_latency_seconds", "mainspring_loads",
                 "mainspring_device_busy_fraction", "mainspring_prediction_error_seconds", "mainspring_rejections",
                 "mainspring_workers", "mainspring_controller_loop_lag_seconds"):  # fmt: skip
        assert name in families, name
    assert families["mainspring_workers"].samples[0].value == 1
    # An idle loop is on time (once a busy machine lets it be).
    wait_for(lambda: 0 <= metric(server, "mainspring_controller_loop_lag_seconds") < 1.0)
    stats = http.get_inference_statistics("mlp")["model_stats"][0]
    assert stats["name"] == "mlp" and stats["inference_stats"]["success"]["count"] >= 2
    assert http.get_inference_statistics("mlp", "1")["model_stats"][0]["version"] == "1"
    # A version not served has no statistics (it used to answer the served version's, with a 200).
    status, body = http_call(f"http://{server.http}/v2/models/mlp/versions/2/stats")
    assert status == 404 and "Request for unknown model: 'mlp' version 2 is not found" in body.decode()
    with pytest.raises(InferenceServerException, match="'mlp' version 2 is not found"):
        grpc.get_inference_statistics("mlp", "2")
    status, body = http_call(f"http://{server.http}/v2/openapi.json")
    document = json.loads(body)
    assert status == 200 and document["openapi"].startswith("3.")
    assert "/v2/models/{model}/infer" in document["paths"] and "/metrics" in document["paths"]


def test_grpc_typed_contents_and_http_nested_json(server: ServerProcess) -> None:
    import grpc as grpclib
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    data = inputs_for("mlp", 2, seed=9)
    expected = reference("mlp", data)
    with grpclib.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="mlp")
        tensor = request.inputs.add(name="input", datatype="FP32", shape=[2, 256])
        tensor.contents.fp32_contents.extend(data.ravel().tolist())
        reply = stub.ModelInfer(request, timeout=60)
        request.parameters["slo_ms"].double_param = 0.01
        with pytest.raises(grpclib.RpcError) as rejected:
            stub.ModelInfer(request, timeout=60)
        trailing = dict(rejected.value.trailing_metadata())  # type: ignore[attr-defined]
        assert trailing["mainspring-outcome"] == "deadline_at_arrival"
        del request.parameters["slo_ms"]
        request.raw_input_contents.append(data.tobytes())  # the same tensor twice: which one is meant?
        with pytest.raises(grpclib.RpcError) as ambiguous:
            stub.ModelInfer(request, timeout=60)
        assert "contents must be empty with raw_input_contents" in ambiguous.value.details()  # type: ignore[attr-defined]
        misplaced = service_pb2.ModelInferRequest(model_name="mlp")
        misplaced.inputs.add(name="input", datatype="FP32", shape=[1, 256]).contents.int_contents.extend([0] * 256)
        with pytest.raises(grpclib.RpcError) as wrong_field:
            stub.ModelInfer(misplaced, timeout=60)
        assert "FP32 data goes in fp32_contents, got int_contents" in wrong_field.value.details()  # type: ignore[attr-defined]
    got = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(list(reply.outputs[0].shape))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    nested = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 256], "data": data.tolist()}]}
    status, body = http_call(f"http://{server.http}/v2/models/mlp/infer", json.dumps(nested).encode())
    assert status == 200
    output = json.loads(body)["outputs"][0]
    assert output["shape"] == [2, 10]
    np.testing.assert_allclose(np.array(output["data"]).reshape(2, 10), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_mainspring_bench_drives_the_server(server: ServerProcess, protocol: str, tmp_path: Path) -> None:
    url = server.grpc if protocol == "grpc" else server.http
    command = [sys.executable, "-m", "mainspring.cli", "bench", "--url", url, "--protocol", protocol,
               "--models", "mlp,resnet18", "--rate", "20", "--duration-s", "2", "--slo-ms", "5000",
               "--json", str(tmp_path / "report.json"), "--log", str(tmp_path / "requests.tsv"),
               "--plot", str(tmp_path / "plots"), "--quiet"]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert 20 <= report["requests"] <= 65 and report["slo_attainment"] == 1.0, report
    assert set(report["by_model"]) == {"mlp", "resnet18"} and "SLO attainment" in finished.stdout
    assert len((tmp_path / "requests.tsv").read_text().splitlines()) == report["requests"] + 1
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["latency-cdf.png", "over-time.png"]


def test_the_server_writes_logs_that_analyze_reads(
    server: ServerProcess, http: httpclient.InferenceServerClient, log_dir: Path
) -> None:
    tensor = httpclient.InferInput("input", [1, 256], "FP32")
    tensor.set_data_from_numpy(inputs_for("mlp", 1))
    (run,) = runs(log_dir)
    logged = log_dir / f"{run}-requests.tsv"
    before = logged.read_text().count("\n")

    def flushed() -> bool:  # two answers more in the logs, up to a whole line (mlp may be logged as mlp@N, a reload)
        http.infer("mlp", [tensor])  # an answer flushes the logs when the last flush is a second old
        text = logged.read_text()
        return text.count("\n") >= before + 2 and text.endswith("\n")

    wait_for(flushed)
    assert run.startswith("live-")
    analysis = analyze(log_dir, run)
    assert analysis.requests >= 2 and analysis.infer_error_ms  # infers ran, with measured timings
    requests = (log_dir / f"{run}-requests.tsv").read_text().splitlines()
    assert requests[0].split("\t")[-1] == "outcome" and any("\tmlp\t" in line for line in requests[1:])
