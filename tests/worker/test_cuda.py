"""The CUDA path: pinned host weights, load and exec streams, event timing, CUDA graphs. Needs a GPU."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from mainspring.models.profiler import sample_inputs
from mainspring.models.repository import ModelRepository
from mainspring.models.zoo import build_model
from mainspring.protocol import ActionStatus
from mainspring.protocol.pages import MIB
from mainspring.worker.torch_worker import TorchWorker
from tests.torch_models import RESNET_ARGS, Results
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
]


@pytest.fixture
def results() -> Results:
    return Results()


@pytest.fixture
def gpu_worker(small_zoo: ModelRepository, results: Results) -> Iterator[TorchWorker]:
    worker = TorchWorker(small_zoo, results.put, ["cuda:0"], pool_bytes=512 * MIB)
    yield worker
    worker.close()


def test_weights_are_pinned_and_pages_are_on_the_gpu(gpu_worker: TorchWorker, results: Results) -> None:
    device = gpu_worker._devices[0]
    assert device.arena.tensor.is_cuda
    assert all(t.is_pinned() for t in device._bindings["resnet18"].model.host)
    load = results.load("resnet18")
    gpu_worker.submit(load)
    assert results.wait(load.action_id).status is ActionStatus.OK
    assert all(p.is_cuda for p in device._bindings["resnet18"].params)


@pytest.mark.parametrize(("model", "args"), [("resnet18", RESNET_ARGS), ("bert_tiny", {}), ("mlp", {})])
def test_gpu_outputs_match_the_cpu_and_graphs_are_captured(
    gpu_worker: TorchWorker, results: Results, model: str, args: dict[str, int]
) -> None:
    load = results.load(model)
    gpu_worker.submit(load)
    assert results.wait(load.action_id).status is ActionStatus.OK
    residency = gpu_worker._devices[0]._resident[model]
    # Captured after the load's result, while the load lane is idle
    wait_for(lambda: set(residency.graphs) == set(gpu_worker.configs()[model].batch_sizes))
    config = gpu_worker.configs()[model]
    for batch in config.batch_sizes:
        samples = sample_inputs(config, batch, seed=batch)
        infer = results.infer(model, batch, batch)
        gpu_worker.submit(infer, samples)
        result = results.wait(infer.action_id)
        assert result.status is ActionStatus.OK and 0 < result.timing.duration_ns < 1_000_000_000
        reference = build_model(model, args)
        inputs = [torch.from_numpy(np.concatenate([s[spec.name] for s in samples])) for spec in config.inputs]
        with torch.inference_mode():
            expected = reference(*inputs).numpy()
        got = np.concatenate([o[config.outputs[0].name] for o in result.outputs])
        np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-3)  # TF32 and other kernels than the CPU's


def test_gpu_exec_times_are_tight(gpu_worker: TorchWorker, results: Results) -> None:
    load = results.load("resnet18")
    gpu_worker.submit(load)
    results.wait(load.action_id)
    assert gpu_worker.settle()  # its graphs are in: replays timed, not eager runs beside a capture
    samples = sample_inputs(gpu_worker.configs()["resnet18"], 8)
    durations = []
    for _ in range(200):
        infer = results.infer("resnet18", 8, 8)
        gpu_worker.submit(infer, samples)
        durations.append(results.wait(infer.action_id).timing.duration_ns)
    p50, p99 = np.percentile(durations[20:], [50, 99])
    print(f"resnet18 batch 8 on {gpu_worker.kind}: p50 {p50 / 1e6:.3f} ms p99 {p99 / 1e6:.3f} ms ratio {p99 / p50:.3f}")
    assert p99 < 1_000_000_000


def test_onnx_on_a_cuda_device_is_served_or_named(tmp_path: object, results: Results) -> None:
    """With onnxruntime-gpu the ONNX model runs on the GPU from its pages; with the CPU package it is
    refused at registration naming what is missing (never served wrong)."""
    import onnxruntime

    from tests.onnx_models import build_triton_repo, run_onnx

    repo = build_triton_repo(tmp_path / "repo")  # type: ignore[operator]
    worker = TorchWorker(repo, results.put, ["cuda:0"], pool_bytes=64 * MIB)
    try:
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            assert "needs the onnxruntime-gpu package" in worker.load_errors["onnx_mlp"]
            return
        load = results.load("onnx_mlp")
        worker.submit(load)
        assert results.wait(load.action_id).status is ActionStatus.OK
        x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
        infer = results.infer("onnx_mlp", 2, 2)
        worker.submit(infer, [{"x": x[i : i + 1]} for i in range(2)])
        result = results.wait(infer.action_id)
        assert result.status is ActionStatus.OK, result.message
        got = np.concatenate([o["y"] for o in result.outputs])
        np.testing.assert_allclose(got, run_onnx(repo.model_file("onnx_mlp"), {"x": x})[0], rtol=1e-4, atol=1e-5)
    finally:
        worker.close()


def test_the_gpus_memory_and_each_models_load_time_are_reported(gpu_worker: TorchWorker) -> None:
    """What the worker's heartbeats carry to ``/metrics`` (``nv_gpu_memory_used_bytes{gpu_uuid}``) and its hello
    (``nv_model_load_duration_secs``)."""
    (gpu,) = gpu_worker.gpu_memory()
    _, total = torch.cuda.mem_get_info(0)
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    assert gpu.uuid == (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    assert gpu.total_bytes == total and 512 * MIB <= gpu.used_bytes <= total  # the page pool at least
    assert all(gpu_worker.load_ns_of(model) > 0 for model in gpu_worker.profiles())
