"""ONNX models (and TorchScript ones from a Triton repository) on the torch worker: weights in the
page pool only while loaded, outputs equal to a plain ONNX Runtime session, the rest served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from mainspring.models.repository import ModelRepository
from mainspring.protocol import ActionStatus
from mainspring.worker.torch_worker import TorchWorker
from tests.onnx_models import SUPPORTED, build_triton_repo, run_onnx, write_mlp_onnx, write_torchscript_mlp
from tests.torch_models import Results

PAGE = 4096  # small pages: one model fills the pool, so the next one reuses its memory


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    return build_triton_repo(Path(tmp_path_factory.mktemp("triton")) / "repo")


@pytest.fixture
def results() -> Results:
    return Results()


@pytest.fixture
def worker(triton_repo: ModelRepository, results: Results) -> Iterator[TorchWorker]:
    w = TorchWorker(triton_repo, results.put, pool_bytes=PAGE, page_bytes=PAGE)
    yield w
    w.close()


def run(worker: TorchWorker, results: Results, action: object, inputs: object = None) -> object:
    worker.submit(action, inputs)  # type: ignore[arg-type]
    return results.wait(action.action_id)  # type: ignore[attr-defined]


def infer(worker: TorchWorker, results: Results, model: str, x: np.ndarray, batch: int) -> np.ndarray:
    name = worker.configs()[model].inputs[0].name
    output = worker.configs()[model].outputs[0].name
    result = run(worker, results, results.infer(model, len(x), batch), [{name: x[i : i + 1]} for i in range(len(x))])
    assert result.status is ActionStatus.OK, result.message
    return np.concatenate([o[output] for o in result.outputs])


def test_the_supported_models_are_served_and_the_others_named(worker: TorchWorker) -> None:
    assert sorted(worker.profiles()) == sorted(SUPPORTED)
    assert "sequence_batching" in worker.load_errors["sequence_model"]
    assert "platform ensemble" in worker.load_errors["ensemble_model"]
    assert worker.configs()["onnx_fixed"].batch_sizes == (1,)


def test_onnx_weights_live_in_pages_only_while_loaded(
    worker: TorchWorker, results: Results, triton_repo: ModelRepository
) -> None:
    x = np.random.default_rng(7).standard_normal((5, 16)).astype(np.float32)
    expected = run_onnx(triton_repo.model_file("onnx_mlp"), {"x": x})[0]
    device = worker._devices[0]
    assert device.pool.used_pages == 0
    assert run(worker, results, results.load("onnx_mlp")).status is ActionStatus.OK
    assert device.pool.used_pages == device.pool.total_pages == 1
    arena = device.arena.tensor.data_ptr()
    for buffer in device._bindings["onnx_mlp"].params:  # the weights the session reads are in the page
        assert arena <= buffer.data_ptr() < arena + PAGE
    for batch, count in ((1, 1), (2, 2), (4, 3), (8, 5)):  # every batch size, padded where needed
        np.testing.assert_allclose(infer(worker, results, "onnx_mlp", x[:count], batch), expected[:count], rtol=1e-5)
    device.arena.tensor.zero_()  # ONNX Runtime reads the page: cleared, every row gets the same (the graph's b2)
    cleared = infer(worker, results, "onnx_mlp", x[:2], 2)
    assert not np.allclose(cleared, expected[:2]) and np.array_equal(cleared[0], cleared[1])
    # Another model cannot load while it holds the pool; evicted, its page goes to that model ...
    assert run(worker, results, results.load("torch_mlp")).status is ActionStatus.OUT_OF_MEMORY
    assert run(worker, results, results.evict("onnx_mlp")).status is ActionStatus.OK
    assert device.pool.used_pages == 0
    refused = run(worker, results, results.infer("onnx_mlp", 1, 1), [{"x": x[:1]}])
    assert refused.status is ActionStatus.NOT_RESIDENT
    assert run(worker, results, results.load("torch_mlp")).status is ActionStatus.OK
    assert run(worker, results, results.evict("torch_mlp")).status is ActionStatus.OK
    # ... which overwrote it; loaded again, the ONNX model computes what a plain session does.
    assert run(worker, results, results.load("onnx_mlp")).status is ActionStatus.OK
    np.testing.assert_allclose(infer(worker, results, "onnx_mlp", x[:4], 4), expected[:4], rtol=1e-5)


def test_a_fixed_batch_onnx_model_and_a_triton_torchscript_model(
    worker: TorchWorker, results: Results, triton_repo: ModelRepository, tmp_path: Path
) -> None:
    x = np.random.default_rng(8).standard_normal((3, 16)).astype(np.float32)
    assert run(worker, results, results.load("onnx_fixed")).status is ActionStatus.OK
    expected = run_onnx(triton_repo.model_file("onnx_fixed"), {"x": x[:1]})[0]
    np.testing.assert_allclose(infer(worker, results, "onnx_fixed", x[:1], 1), expected, rtol=1e-5)
    assert run(worker, results, results.evict("onnx_fixed")).status is ActionStatus.OK
    assert run(worker, results, results.load("torch_mlp")).status is ActionStatus.OK
    module = write_torchscript_mlp(tmp_path / "same.pt", seed=4)  # version 2's weights (version_policy)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(infer(worker, results, "torch_mlp", x, 4), expected, rtol=1e-5, atol=1e-6)


def test_onnx_in_mainsprings_own_layout_and_a_fixed_batch_named(tmp_path: Path, results: Results) -> None:
    from mainspring.protocol.models import ModelConfig
    from mainspring.protocol.tensors import TensorSpec

    repo = ModelRepository(tmp_path)
    specs = (TensorSpec("x", "FP32", (-1, 16)),), (TensorSpec("y", "FP32", (-1, 4)),)
    for name, batch in (("free", "batch"), ("fixed", 1)):
        folder = repo.write(ModelConfig(name, "onnx", "model.onnx", *specs, batch_sizes=(1, 2, 4)))
        write_mlp_onnx(folder / "model.onnx", batch=batch)
    worker = TorchWorker(repo, results.put)
    try:
        assert sorted(worker.profiles()) == ["free"]
        assert "fixes the batch dimension at 1: batch_sizes must be [1], not [1, 2, 4]" in worker.load_errors["fixed"]
        x = np.random.default_rng(9).standard_normal((2, 16)).astype(np.float32)
        assert run(worker, results, results.load("free")).status is ActionStatus.OK
        expected = run_onnx(repo.model_file("free"), {"x": x})[0]
        np.testing.assert_allclose(infer(worker, results, "free", x, 2), expected, rtol=1e-5)
    finally:
        worker.close()


def test_a_cuda_session_that_falls_back_to_the_cpu_is_refused_with_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime lists the CUDA provider even when its libraries do not load (onnxruntime#23059), then
    runs on the CPU: refused, saying what to install, rather than served on the CPU unnoticed."""
    import onnxruntime

    from mainspring.models.onnx_module import OnnxModule

    write_mlp_onnx(tmp_path / "model.onnx")
    module = OnnxModule(tmp_path / "model.onnx", ("x",), ("y",))
    listed = ["CUDAExecutionProvider", *onnxruntime.get_available_providers()]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: listed)
    with pytest.raises(RuntimeError, match=r"did not take the CUDA provider for cuda:0 .*mainspring\[onnx-gpu\]"):
        module._session_for(torch.device("cuda", 0))
    assert module(torch.zeros(2, 16))[0].shape == (2, 4)  # on the CPU it runs as before
