"""The CUDA path under what a first GPU user does to it (``make gpu-check``): partial batches, pages
reused by another model, loads beside inference, graphs destroyed while others replay, a capture
that fails, a bad input, shared input buffers, every zoo format, ONNX on its own stream, a second
GPU. Outputs are checked against the CPU; memory is checked not to grow. Needs a GPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from mainspring.models.loading import copy_model, export_zoo_model
from mainspring.models.profiler import sample_inputs
from mainspring.models.repository import ModelRepository
from mainspring.models.zoo import build_model
from mainspring.protocol import ActionResult, ActionStatus
from mainspring.protocol.pages import MIB
from mainspring.protocol.tensors import Sample
from mainspring.worker.runtimes.torch_device import ExecSettings
from mainspring.worker.torch_worker import TorchWorker
from tests.torch_models import RESNET_ARGS, Results
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
]
ARGS = {"resnet18": RESNET_ARGS, "bert_tiny": {}, "mlp": {}}
ARCHITECTURE = {"resnet18_b": "resnet18"}  # a copy: the same file, served under another name


@pytest.fixture(autouse=True)
def exact_kernels() -> Iterator[None]:
    """No TF32 (on by default for cuDNN convolutions): outputs compared with the CPU's stay within tolerance."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture(scope="module")
def exported_zoo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """The zoo's default format, torch.export, for a conv net and a transformer (small_zoo has them in others)."""
    repo = ModelRepository(tmp_path_factory.mktemp("exported") / "repo")
    for name, args in ARGS.items():
        export_zoo_model(repo, name, args=dict(args))
    copy_model(repo, "resnet18", "resnet18_b")
    return repo


@pytest.fixture
def results() -> Results:
    return Results()


@pytest.fixture
def gpu(exported_zoo: ModelRepository, results: Results) -> Iterator[TorchWorker]:
    worker = TorchWorker(exported_zoo, results.put, ["cuda:0"], pool_bytes=256 * MIB, models=list(ARGS))
    yield worker
    worker.close()


def run(worker: TorchWorker, results: Results, action: object, inputs: list[Sample] | None = None) -> ActionResult:
    worker.submit(action, inputs)  # type: ignore[arg-type]
    return results.wait(action.action_id)  # type: ignore[attr-defined]


def load(worker: TorchWorker, results: Results, model: str, graphs: bool = True) -> None:
    assert run(worker, results, results.load(model)).status is ActionStatus.OK
    if graphs:  # captured after the load, while the load lane is idle
        residency = worker._devices[0]._resident[model]
        wanted = {b for b in worker.configs()[model].batch_sizes if worker._devices[0].graphs.wanted(model, b)}
        wait_for(lambda: set(residency.graphs) >= wanted)


def expected(worker: TorchWorker, model: str, samples: list[Sample]) -> np.ndarray:
    """The same model and weights on the CPU."""
    config = worker.configs()[model]
    architecture = ARCHITECTURE.get(model, model)
    reference = build_model(architecture, ARGS[architecture])
    inputs = [torch.from_numpy(np.concatenate([s[spec.name] for s in samples])) for spec in config.inputs]
    with torch.inference_mode():
        out = reference(*inputs)
    return (out[0] if isinstance(out, tuple) else out).numpy()


def infer_checked(worker: TorchWorker, results: Results, model: str, count: int, batch: int, seed: int = 0) -> None:
    samples = sample_inputs(worker.configs()[model], count, seed=seed)
    result = run(worker, results, results.infer(model, count, batch), samples)
    assert result.status is ActionStatus.OK, result.message
    name = worker.configs()[model].outputs[0].name
    got = np.concatenate([o[name] for o in result.outputs])
    np.testing.assert_allclose(got, expected(worker, model, samples), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("model", list(ARGS))
def test_partial_batches_are_padded_and_match_the_cpu(gpu: TorchWorker, results: Results, model: str) -> None:
    load(gpu, results, model)
    for batch in gpu.configs()[model].batch_sizes:
        for count in sorted({1, max(1, batch - 1), batch}):
            infer_checked(gpu, results, model, count, batch, seed=count)


def test_pages_freed_by_one_model_serve_another_and_graphs_die_while_others_replay(
    gpu: TorchWorker, results: Results
) -> None:
    """50 load/evict cycles of two models through the same pages beside a resident one whose graphs
    replay throughout: every output checked, the device synchronized, memory not growing."""
    load(gpu, results, "resnet18")
    reserved = []
    for cycle in range(50):
        model = ("mlp", "bert_tiny")[cycle % 2]
        load(gpu, results, model)
        infer_checked(gpu, results, model, 2, 2, seed=cycle)
        infer_checked(gpu, results, "resnet18", 4, 4, seed=cycle)
        assert run(gpu, results, results.evict(model)).status is ActionStatus.OK
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    print(f"memory reserved over the cycles: first {reserved[0] / MIB:.0f} MiB, last {reserved[-1] / MIB:.0f} MiB")
    assert reserved[-1] <= reserved[9] * 1.1 + 64 * MIB  # the shared graph pool does not grow with each capture


def test_a_load_runs_during_an_inference(gpu: TorchWorker, results: Results) -> None:
    load(gpu, results, "resnet18")
    samples = sample_inputs(gpu.configs()["resnet18"], 8)
    infer = results.infer("resnet18", 8, 8)
    with torch.cuda.stream(gpu._devices[0]._exec_stream):
        torch.cuda._sleep(500_000_000)  # the exec stream is busy for a while before the inference's kernels
    gpu.submit(infer, samples)
    loaded = run(gpu, results, results.load("bert_tiny"))
    assert infer.action_id not in results._seen  # the load was done while the inference waited on its stream
    done = results.wait(infer.action_id)
    assert loaded.status is ActionStatus.OK and done.status is ActionStatus.OK
    infer_checked(gpu, results, "bert_tiny", 1, 1)


def test_a_capture_that_fails_leaves_the_model_eager_and_is_not_retried(gpu: TorchWorker, results: Results) -> None:
    device = gpu._devices[0]
    module = device._bindings["mlp"].module

    def synchronize(m: object, args: object, out: torch.Tensor) -> None:
        out.cpu()  # a copy to the host waits for the GPU: not allowed while capturing

    hook = module.register_forward_hook(synchronize)
    try:
        load(gpu, results, "mlp", graphs=False)
        wait_for(lambda: all(not device.graphs.wanted("mlp", b) for b in gpu.configs()["mlp"].batch_sizes))
    finally:
        hook.remove()
    assert device._resident["mlp"].graphs == {}
    infer_checked(gpu, results, "mlp", 2, 2)
    assert run(gpu, results, results.evict("mlp")).status is ActionStatus.OK
    load(gpu, results, "mlp", graphs=False)  # not captured again at the next load
    assert device._resident["mlp"].graphs == {}
    load(gpu, results, "resnet18")  # other models still capture
    infer_checked(gpu, results, "resnet18", 4, 4)


def test_a_bad_input_fails_alone_on_the_gpu(exported_zoo: ModelRepository, results: Results) -> None:
    """The isolate path on CUDA: a batch that fails is run a request at a time, and only the request
    whose input the model refuses fails (the model refuses it in Python, before any kernel; eager, no
    graphs, so that the check runs)."""
    settings = ExecSettings(cuda_graphs=False)
    worker = TorchWorker(exported_zoo, results.put, ["cuda:0"], pool_bytes=64 * MIB, models=["mlp"], settings=settings)
    try:
        load(worker, results, "mlp", graphs=False)
        module = worker._devices[0]._bindings["mlp"].module

        def refuse_negative_first(m: object, args: tuple[torch.Tensor, ...]) -> None:
            if bool((args[0][:, 0] < -100).any()):
                raise ValueError("an input the model refuses")

        hook = module.register_forward_pre_hook(refuse_negative_first)
        try:
            samples = sample_inputs(worker.configs()["mlp"], 4)
            samples[2]["input"][0, 0] = -1000.0
            result = run(worker, results, results.infer("mlp", 4, 4), samples)
        finally:
            hook.remove()
        assert result.status is ActionStatus.OK and result.failed is not None and set(result.failed) == {2}, result
    finally:
        worker.close()


def test_models_of_one_input_signature_share_input_buffers_on_the_gpu(
    exported_zoo: ModelRepository, results: Results
) -> None:
    worker = TorchWorker(exported_zoo, results.put, ["cuda:0"], pool_bytes=256 * MIB, models=["resnet18", "resnet18_b"])
    try:
        device = worker._devices[0]
        a, b = device._bindings["resnet18"], device._bindings["resnet18_b"]
        assert all(a.inputs[k][0].data_ptr() == b.inputs[k][0].data_ptr() for k in a.inputs)
        for model in ("resnet18", "resnet18_b"):
            load(worker, results, model)
        for seed in range(4):
            for model in ("resnet18", "resnet18_b"):
                infer_checked(worker, results, model, 3, 4, seed=seed)
    finally:
        worker.close()


def test_onnx_on_cuda_reads_inputs_written_on_a_busy_stream(tmp_path: Path, results: Results) -> None:
    """ONNX Runtime runs on a stream of its own: each run waits for the exec stream's input copies, even
    with the GPU held busy by another stream meanwhile."""
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime-gpu is not installed (make gpu-check installs it)")
    from tests.onnx_models import build_triton_repo, run_onnx

    repo = build_triton_repo(tmp_path / "repo")
    worker = TorchWorker(repo, results.put, ["cuda:0"], pool_bytes=64 * MIB)
    try:
        load(worker, results, "onnx_mlp", graphs=False)
        rng = np.random.default_rng(2)
        exec_stream = worker._devices[0]._exec_stream
        for _ in range(20):
            with torch.cuda.stream(exec_stream):  # the input copies and padding queue behind this on their stream
                torch.cuda._sleep(20_000_000)
            x = rng.standard_normal((3, 16)).astype(np.float32)  # 3 in a batch of 4: a padded row too
            result = run(worker, results, results.infer("onnx_mlp", 3, 4), [{"x": x[i : i + 1]} for i in range(3)])
            assert result.status is ActionStatus.OK, result.message
            got = np.concatenate([o["y"] for o in result.outputs])
            np.testing.assert_allclose(got, run_onnx(repo.model_file("onnx_mlp"), {"x": x})[0], rtol=1e-4, atol=1e-5)
    finally:
        worker.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="one GPU")
def test_a_second_gpu_serves_as_the_first(small_zoo: ModelRepository, results: Results) -> None:
    worker = TorchWorker(small_zoo, results.put, ["cuda:1"], pool_bytes=256 * MIB)
    try:
        load(worker, results, "resnet18")
        infer_checked(worker, results, "resnet18", 4, 4)
        assert worker._devices[0].arena.tensor.device == torch.device("cuda", 1)
    finally:
        worker.close()
