"""What Triton's own example clients (``triton-inference-server/client``, ``src/python/examples``) do, against
``mainspring serve`` holding Triton's first model, ``simple``, which has no weights: the same calls through the
unmodified ``tritonclient``, written from the protocol's documentation. The repository beside it holds models that
cannot be served (a file that is no model, a config that does not parse, an operator the runtime lacks): they
are indexed with the reason, and the rest serve, a TorchScript module without parameters among them. Two frontend
processes share the ports, so shared-memory registrations are the server's."""

from __future__ import annotations

import asyncio
import base64
import queue
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from mainspring.models.repository import ModelRepository
from mainspring.protocol.models import ModelConfig
from mainspring.protocol.tensors import TensorSpec
from tests.onnx_models import write_simple
from tests.serving.processes import ServerProcess
from tests.waiting import wait_for

INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.ones((1, 16), dtype=np.int32)
SUM, DIFFERENCE = INPUT0 + INPUT1, INPUT0 - INPUT1


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def write_garbage(root: Path, name: str) -> None:
    """A Triton config beside a file that is no ONNX model."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.onnx").write_bytes(b"\x08\x07 not a model" * 20)
    (root / name / "config.pbtxt").write_text((root / "simple" / "config.pbtxt").read_text().replace("simple", name))


def build_repository(root: Path) -> None:
    write_simple(root)
    write_simple(root, "badop", op="NoSuchOp")
    write_garbage(root, "garbage")
    (root / "badcfg" / "1").mkdir(parents=True)
    (root / "badcfg" / "config.pbtxt").write_text("this is { not a config")
    # A TorchScript module with no parameters at all: weightless too, served from the config.json layout.
    spec = (TensorSpec("x", "FP32", (-1, 4)),)
    folder = ModelRepository(root).write(
        ModelConfig("double", "torchscript", "model.pt", spec, (TensorSpec("y", "FP32", (-1, 4)),))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated upstream; archives still load
        torch.jit.script(Double()).save(str(folder / "model.pt"))  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("triton-clients")
    build_repository(folder / "repo")
    flags = ("--slo-ms", "30000", "--frontends", "2", "--repository-poll-s", "0.2")
    process = ServerProcess(folder / "repo", folder / "server.log", *flags)
    try:
        process.wait_ready()
        yield process
    finally:
        assert process.stop() == 0, (folder / "server.log").read_text()


def http_inputs(module: Any = httpclient) -> list[Any]:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(INPUT0)
    inputs[1].set_data_from_numpy(INPUT1)
    return inputs


def check_sum_and_difference(result: Any) -> None:
    assert np.array_equal(result.as_numpy("OUTPUT0"), SUM)
    assert np.array_equal(result.as_numpy("OUTPUT1"), DIFFERENCE)


def test_the_weightless_models_serve_and_the_broken_ones_say_why(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["simple"]["state"] == index["double"]["state"] == "READY"
    reasons = {name: index[name]["reason"] for name in ("badop", "garbage", "badcfg")}
    assert all(index[name]["state"] == "UNAVAILABLE" for name in reasons)
    assert "NoSuchOp" in reasons["badop"] and "config.pbtxt" in reasons["badop"]
    assert "not an ONNX model" in reasons["garbage"] and "config.pbtxt" in reasons["badcfg"]
    x = httpclient.InferInput("x", [2, 4], "FP32")
    x.set_data_from_numpy(np.arange(8, dtype=np.float32).reshape(2, 4))
    assert np.array_equal(client.infer("double", [x]).as_numpy("y"), np.arange(8, dtype=np.float32).reshape(2, 4) * 2)
    with pytest.raises(InferenceServerException, match="NoSuchOp"):  # loading it again says why again
        client.load_model("badop")
    check_sum_and_difference(client.infer("simple", http_inputs()))  # and nothing else stopped


def test_models_put_in_the_polled_repository_serve_or_say_why(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http)
    write_garbage(server.repo, "garbage_later")
    write_simple(server.repo, "simple_later")

    def state(name: str) -> dict[str, str]:
        return next((e for e in client.get_model_repository_index() if e["name"] == name), {})

    wait_for(lambda: state("simple_later").get("state") == "READY", 60)
    wait_for(lambda: "not an ONNX model" in state("garbage_later").get("reason", ""), 60)
    assert state("garbage_later")["state"] == "UNAVAILABLE"
    check_sum_and_difference(client.infer("simple_later", http_inputs()))


def test_http_infer_sync_async_and_aio(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http, concurrency=4)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]  # fmt: skip
    check_sum_and_difference(client.infer("simple", http_inputs(), outputs=outputs, request_id="1"))
    pending = [client.async_infer("simple", http_inputs()) for _ in range(4)]
    for request in pending:
        check_sum_and_difference(request.get_result())
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("wrong_model_name", http_inputs())
    assert unknown.value.message().startswith("Request for unknown model: 'wrong_model_name' is not found")
    with pytest.raises(InferenceServerException, match="expected 2 inputs but got 1 inputs for model 'simple'"):
        client.infer("simple", http_inputs()[:1])

    async def aio() -> None:
        async with httpaio.InferenceServerClient(server.http) as aio_client:
            check_sum_and_difference(await aio_client.infer("simple", http_inputs(httpaio)))
            with pytest.raises(InferenceServerException) as unknown:
                await aio_client.infer("wrong_model_name", http_inputs(httpaio))
            assert unknown.value.message().startswith("Request for unknown model")

    asyncio.run(aio())


def test_grpc_infer_async_aio_custom_arguments_and_keepalive(server: ServerProcess) -> None:
    keepalive = grpcclient.KeepAliveOptions(
        keepalive_time_ms=2**31 - 1, keepalive_timeout_ms=20000, http2_max_pings_without_data=2
    )
    client = grpcclient.InferenceServerClient(server.grpc, keepalive_options=keepalive,
                                              channel_args=[("grpc.max_receive_message_length", 2**20)])  # fmt: skip
    check_sum_and_difference(client.infer("simple", http_inputs(grpcclient), client_timeout=30))
    answers: queue.Queue[Any] = queue.Queue()
    client.async_infer("simple", http_inputs(grpcclient), lambda result, error: answers.put((result, error)))
    result, error = answers.get(timeout=60)
    assert error is None
    check_sum_and_difference(result)
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("wrong_model_name", http_inputs(grpcclient))
    assert unknown.value.message().startswith("Request for unknown model: 'wrong_model_name' is not found")
    assert unknown.value.status() == "StatusCode.NOT_FOUND"

    async def aio() -> None:
        async with grpcaio.InferenceServerClient(server.grpc) as aio_client:
            check_sum_and_difference(await aio_client.infer("simple", http_inputs(grpcaio)))

    asyncio.run(aio())


def test_grpc_explicit_int_contents_through_the_raw_stub(server: ServerProcess) -> None:
    import grpc

    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="simple")
        for name, data in (("INPUT0", INPUT0), ("INPUT1", INPUT1)):
            tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            tensor.contents.int_contents[:] = data.ravel().tolist()
        response = stub.ModelInfer(request)
    by_name = {output.name: index for index, output in enumerate(response.outputs)}
    for name, expected in (("OUTPUT0", SUM), ("OUTPUT1", DIFFERENCE)):
        raw = response.raw_output_contents[by_name[name]]
        assert np.array_equal(np.frombuffer(raw, dtype=np.int32).reshape(1, 16), expected)


@pytest.fixture
def regions() -> Iterator[dict[str, Any]]:
    """Two input and two output regions of 64 bytes each (16 INT32), as ``reuse_infer_objects_client`` makes."""
    handles = {name: shm.create_shared_memory_region(name, f"/ms_test_{name}", 64) for name in
               ("input0_data", "input1_data", "output0_data", "output1_data")}  # fmt: skip
    shm.set_shared_memory_region(handles["input0_data"], [INPUT0])
    shm.set_shared_memory_region(handles["input1_data"], [INPUT1])
    yield handles
    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_inputs_and_outputs_and_reused_infer_objects(
    server: ServerProcess, regions: dict[str, Any], protocol: str
) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http if protocol == "http" else server.grpc)
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()  # nothing registered: no error, as the examples start
    for name in regions:
        client.register_system_shared_memory(name, f"/ms_test_{name}", 64)
    status = client.get_system_shared_memory_status()
    listed = {r["name"] for r in status} if protocol == "http" else set(status.regions)
    assert listed == set(regions)
    inputs = http_inputs(module)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    for use_shared_memory in (True, False, True):  # the same objects, switched back and forth
        if use_shared_memory:
            inputs[0].set_shared_memory("input0_data", 64)
            inputs[1].set_shared_memory("input1_data", 64)
            outputs[0].set_shared_memory("output0_data", 64)
            outputs[1].set_shared_memory("output1_data", 64)
        else:
            inputs[0].set_data_from_numpy(INPUT0)
            inputs[1].set_data_from_numpy(INPUT1)
            outputs[0].unset_shared_memory()
            outputs[1].unset_shared_memory()
        result = client.infer("simple", inputs, outputs=outputs)
        if use_shared_memory:
            output = result.get_output("OUTPUT0")
            shape = list(output["shape"] if protocol == "http" else output.shape)
            assert shape == [1, 16]
            assert np.array_equal(shm.get_contents_as_numpy(regions["output0_data"], np.int32, shape), SUM)
            assert np.array_equal(shm.get_contents_as_numpy(regions["output1_data"], np.int32, shape), DIFFERENCE)
        else:
            check_sum_and_difference(result)
    client.unregister_system_shared_memory("output1_data")
    with pytest.raises(InferenceServerException, match="region 'output1_data' is not registered"):
        client.infer("simple", inputs, outputs=outputs)
    client.unregister_system_shared_memory()
    status = client.get_system_shared_memory_status()
    assert not (status if protocol == "http" else status.regions)


def test_every_frontend_process_reads_the_servers_registrations(server: ServerProcess, regions: dict[str, Any]) -> None:
    setup = httpclient.InferenceServerClient(server.http)
    setup.unregister_system_shared_memory()
    setup.register_system_shared_memory("inputs", "/ms_test_input0_data", 64)
    try:
        for _ in range(12):  # each a new connection: the kernel spreads them over both frontend processes
            client = httpclient.InferenceServerClient(server.http)
            inputs = http_inputs()
            inputs[0].set_shared_memory("inputs", 64)
            check_sum_and_difference(client.infer("simple", inputs))
            client.close()
    finally:
        setup.unregister_system_shared_memory()


def test_shared_memory_refuses_what_it_cannot_honour_naming_it(server: ServerProcess, regions: dict[str, Any]) -> None:
    http = httpclient.InferenceServerClient(server.http)
    grpc = grpcclient.InferenceServerClient(server.grpc)
    http.unregister_system_shared_memory()
    for client in (http, grpc):
        with pytest.raises(InferenceServerException, match="offset 32 \\+ byte_size 64 exceeds the 64 bytes"):
            client.register_system_shared_memory("r", "/ms_test_input0_data", 64, offset=32)
        with pytest.raises(InferenceServerException, match="cannot open object '/ms_test_absent'"):
            client.register_system_shared_memory("r", "/ms_test_absent", 64)
        with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported"):
            client.register_cuda_shared_memory("c", base64.b64encode(bytes(64)), 0, 64)
    http.register_system_shared_memory("small", "/ms_test_output0_data", 32)
    try:
        with pytest.raises(InferenceServerException, match="already registered"):
            grpc.register_system_shared_memory("small", "/ms_test_output0_data", 32)
        for client, module in ((http, httpclient), (grpc, grpcclient)):
            outputs = [module.InferRequestedOutput("OUTPUT0")]
            outputs[0].set_shared_memory("small", 64)  # more than the region holds: refused before the model runs
            with pytest.raises(InferenceServerException, match="exceeds the 32 bytes of region 'small'"):
                client.infer("simple", http_inputs(module), outputs=outputs)
            inputs = http_inputs(module)
            inputs[0].set_shared_memory("nowhere", 64)
            with pytest.raises(InferenceServerException, match="input 'INPUT0': shared memory region 'nowhere'"):
                client.infer("simple", inputs)
    finally:
        http.unregister_system_shared_memory()
    check_sum_and_difference(http.infer("simple", http_inputs(), outputs=None))
    assert np_to_triton_dtype(np.int32) == "INT32"
