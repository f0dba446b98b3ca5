"""The parts of the CUDA path whose logic needs no GPU, checked on this CPU with the failure injected:
a lost context, a capture that fails, idle work on a lane, weights pinned in one buffer, and the
torch.export device move."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mainspring.models.loading import load_module
from mainspring.models.profiler import sample_inputs
from mainspring.models.repository import ModelRepository
from mainspring.protocol import ActionStatus
from mainspring.protocol.models import ModelConfig
from mainspring.protocol.pages import MIB
from mainspring.protocol.tensors import TensorSpec
from mainspring.time import WallClock
from mainspring.worker.executor import Lane
from mainspring.worker.runtimes import host_weights
from mainspring.worker.runtimes.cuda_graphs import GraphCapture, is_sticky_cuda_error
from mainspring.worker.runtimes.host_weights import HostModel
from mainspring.worker.torch_worker import TorchWorker
from tests.torch_models import Results

ASSERT = "CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported"


@pytest.fixture
def results() -> Results:
    return Results()


@pytest.fixture
def lost_worker(small_zoo: ModelRepository, results: Results) -> Iterator[tuple[TorchWorker, list[str]]]:
    told: list[str] = []
    worker = TorchWorker(small_zoo, results.put, models=["mlp", "bert_tiny"], pool_bytes=64 * MIB, on_lost=told.append)
    yield worker, told
    worker.close()


def test_a_sticky_cuda_error_fails_its_batch_refuses_all_later_work_and_tells_the_worker_once(
    lost_worker: tuple[TorchWorker, list[str]], results: Results
) -> None:
    worker, told = lost_worker
    for model in ("mlp", "bert_tiny"):
        load = results.load(model)
        worker.submit(load)
        assert results.wait(load.action_id).status is ActionStatus.OK

    def assert_on_device(module: nn.Module, args: object) -> None:
        raise RuntimeError(ASSERT)  # what an out-of-range embedding id does on a GPU

    hook = worker._devices[0]._bindings["mlp"].module.register_forward_pre_hook(assert_on_device)
    try:
        infer = results.infer("mlp", 2, 2)
        worker.submit(infer, sample_inputs(worker.configs()["mlp"], 2))
        failed = results.wait(infer.action_id)
    finally:
        hook.remove()
    assert failed.status is ActionStatus.ERROR and "CUDA context of cpu is lost" in failed.message
    assert "valid_range" in failed.message and failed.outputs is None  # no request run alone on a dead context
    after = [results.infer("bert_tiny", 1, 1), results.load("mlp"), results.evict("bert_tiny")]
    for action, inputs in zip(after, [sample_inputs(worker.configs()["bert_tiny"], 1), None, None], strict=True):
        worker.submit(action, inputs)
        refused = results.wait(action.action_id)
        assert refused.status is ActionStatus.ERROR and "is lost" in refused.message, refused
    assert len(told) == 1 and "device-side assert triggered" in told[0]


def test_only_errors_that_poison_the_context_are_sticky() -> None:
    assert is_sticky_cuda_error(RuntimeError(ASSERT))
    assert is_sticky_cuda_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_sticky_cuda_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_sticky_cuda_error(IndexError("index out of range in self"))


def test_a_failed_capture_is_logged_once_and_not_tried_again_until_the_model_registers_anew(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts = []

    def failing_graph() -> object:
        attempts.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    capture = GraphCapture(torch.device("cpu"), None, new_graph=failing_graph)
    with caplog.at_level(logging.WARNING):
        assert capture.wanted("m", 4)
        assert capture.capture("m", 4, nn.Identity(), (), (), tuple) is None
    assert not capture.wanted("m", 4) and capture.wanted("m", 8) and capture.wanted("n", 4)
    assert len(attempts) == 1 and capture.failed == {("m", 4): "operation not permitted when stream is capturing"}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not tried again" in warnings[0].getMessage()
    capture.forget("m")  # registered anew (a reload): its graphs may be captured again
    assert capture.wanted("m", 4)

    def poisoned() -> object:
        raise RuntimeError(ASSERT)

    with pytest.raises(RuntimeError, match="device-side assert"):  # not remembered: the context is gone
        GraphCapture(torch.device("cpu"), None, new_graph=poisoned).capture("m", 4, nn.Identity(), (), (), tuple)


def test_idle_work_runs_only_while_no_action_is_due(results: Results) -> None:
    done: list[str] = []
    started = threading.Event()
    release = threading.Event()
    lane = Lane("test", WallClock(), lambda action, _: (done.append(f"action {action.action_id}"), ok(action))[1],
                results.put)  # fmt: skip
    try:
        first = results.load("m", start_in_ms=300)  # due later: idle work may run meanwhile
        lane.submit(first)

        def hold() -> None:
            started.set()
            release.wait(60)
            done.append("idle 1")

        lane.when_idle(hold)
        lane.when_idle(lambda: done.append("idle 2"))
        assert started.wait(60)
        release.set()
        assert results.wait(first.action_id).status is ActionStatus.OK
        assert done == ["idle 1", "idle 2", "action 1"] or done == ["idle 1", "action 1", "idle 2"], done
        due = results.load("m")  # due now, with idle work queued: the action goes first
        lane.when_idle(lambda: done.append("idle 3"))
        lane.submit(due)
        assert results.wait(due.action_id).status is ActionStatus.OK
    finally:
        lane.close()


def ok(action: object) -> object:
    from mainspring.protocol import ActionResult, Timing

    now = WallClock().now_ns()
    return ActionResult(action.action_id, action.device, ActionStatus.OK, Timing(now, now))  # type: ignore[attr-defined]


def test_weights_pinned_in_one_buffer_are_views_of_it_with_their_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned allocator rounds each allocation up to a power of two: one buffer per model, not per tensor."""
    allocations: list[int] = []

    def buffer(nbytes: int, device: torch.device) -> torch.Tensor:  # pinning needs CUDA; the layout does not
        allocations.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    monkeypatch.setattr(host_weights, "pinned_buffer", buffer)
    tensors = {
        "w": torch.randn(3, 5),
        "b": torch.arange(7, dtype=torch.int64),
        "h": torch.randn(2, dtype=torch.float16),
    }
    spec = TensorSpec("x", "FP32", (-1, 5))
    config = ModelConfig("m", "torch_export", "model.pt2", (spec,), (spec,))
    host = HostModel.from_tensors(config, tensors, 4096, pin_for=torch.device("cuda", 0))
    assert allocations == [sum(host.tensor_bytes)]
    base = host.host[0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in host.host)
    for original, held in zip(tensors.values(), host.host, strict=True):
        assert torch.equal(original, held)


class Offset(nn.Module):
    """A model that makes a tensor in its forward pass: export fixes the device it makes it on."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + torch.arange(4, dtype=torch.float32)


def test_a_torch_export_model_is_moved_whole_to_the_device_it_runs_on(tmp_path: Path) -> None:
    """Export fixes the devices of what the graph makes itself (pytorch#151010); moving the parameters alone
    leaves those behind. "meta" stands for the GPU here: a graph node still on the CPU would show."""
    repo = ModelRepository(tmp_path)
    config = ModelConfig("offset", "torch_export", "model.pt2", (TensorSpec("x", "FP32", (-1, 4)),),
                         (TensorSpec("y", "FP32", (-1, 4)),))  # fmt: skip
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(Offset(), (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, repo.write(config) / config.file)

    def devices(module: nn.Module) -> set[str]:
        found = {str(t.device) for t in [*module.parameters(), *module.buffers()]}
        graph: Any = module.graph
        return found | {str(node.kwargs["device"]) for node in graph.nodes if node.kwargs.get("device") is not None}

    _, on_cpu = load_module(repo, "offset")
    _, moved = load_module(repo, "offset", device=torch.device("meta"))
    assert devices(on_cpu) == {"cpu"}
    assert devices(moved) == {"meta"}  # the arange too, not only the parameter
    assert moved(torch.zeros(2, 4, device="meta")).device.type == "meta"


def test_a_worker_whose_context_is_lost_sends_its_results_and_starts_over(
    small_zoo: ModelRepository, results: Results
) -> None:
    import zmq

    from mainspring.transport.messages import Hello, Result, decode
    from mainspring.worker.process import START_OVER, WorkerConnection

    controller = zmq.Context.instance().socket(zmq.ROUTER)
    controller.setsockopt(zmq.LINGER, 0)
    port = controller.bind_to_random_port("tcp://127.0.0.1")
    connection = WorkerConnection(f"tcp://127.0.0.1:{port}", lambda sink: TorchWorker(small_zoo, sink, models=["mlp"]))
    outcome: list[str] = []
    serving = threading.Thread(target=lambda: outcome.append(connection.serve()))
    serving.start()
    try:
        assert controller.poll(60_000)
        _, *frames = controller.recv_multipart()
        assert isinstance(decode(frames)[0], Hello)
        connection._on_result(ok(results.load("mlp")))  # a result already on its way out
        connection.start_over("the CUDA context of cuda:0 is lost")
        serving.join(60)
        said = []
        while controller.poll(5_000):
            said.append(decode(controller.recv_multipart()[1:])[0])
        assert [type(m) for m in said] == [Result], said
        assert outcome == [START_OVER]
    finally:
        connection.stop()
        serving.join(10)
        controller.close()


def test_a_gpu_pool_is_what_is_free_after_registration_less_what_lives_outside_it() -> None:
    from mainspring.worker.runtimes.device_memory import CONTEXT_BYTES, pool_after_registration

    page = 16 * MIB
    free = 70 * 1024 * MIB  # an 80 GB GPU with the models registered
    size, outside = pool_after_registration(free, page, [100 * MIB, 300 * MIB], [50 * MIB, 20 * MIB])
    assert outside.registration == 600 * MIB and outside.activations == 100 * MIB
    assert outside.total == CONTEXT_BYTES + 700 * MIB
    assert size % page == 0 and free - outside.total - page < size <= free - outside.total
    assert "600 for a registration" in outside.describe()
    # a device with little free: one page at least (its loads then fail OUT_OF_MEMORY by name, not at start)
    assert pool_after_registration(512 * MIB, page, [400 * MIB], [0])[0] == page


def test_a_pool_opened_after_registration_serves_loads_and_none_before(
    small_zoo: ModelRepository, results: Results
) -> None:
    from mainspring.protocol import DeviceSpec
    from mainspring.worker.runtimes.torch_device import ExecSettings, TorchDevice

    device = TorchDevice(DeviceSpec(0, "cpu", 0), torch.device("cpu"), WallClock(), results.put, ExecSettings())
    worker = TorchWorker(small_zoo, results.put, models=["mlp"], pool_bytes=64 * MIB)
    try:
        binding = worker._devices[0]._bindings["mlp"]
        device.add(binding.model, binding.module)
        early = results.load("mlp")
        device.submit(early)
        refused = results.wait(early.action_id)
        assert refused.status is ActionStatus.ERROR and "not allocated yet" in refused.message
        device.open_pool(32 * MIB)
        assert device.spec.pool_bytes == 32 * MIB and device.pool.total_pages == 2
        later = results.load("mlp")
        device.submit(later)
        assert results.wait(later.action_id).status is ActionStatus.OK
    finally:
        device.close()
        worker.close()
    with pytest.raises(ValueError, match="only a GPU's is sized after registration"):
        TorchWorker(small_zoo, results.put, models=[], pool_bytes=0)
