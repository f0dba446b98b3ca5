"""The wire format, clock-offset estimation, and a real ZeroMQ hub talking to a real worker connection."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from mainspring.models.profiler import sample_inputs
from mainspring.models.repository import ModelRepository
from mainspring.protocol import ActionResult, ActionStatus, DeviceSpec, Infer, LoadWeights, Timing
from mainspring.protocol.models import ModelInfo, ModelReply
from mainspring.protocol.pages import MIB
from mainspring.time import NS_PER_MS, NS_PER_S, WallClock
from mainspring.transport.clock_sync import ClockSync
from mainspring.transport.links import WorkerHandle
from mainspring.transport.messages import Act, Result, decode, encode, metas_of
from mainspring.transport.zmq_hub import RemoteWorker, WorkerHub
from mainspring.worker.process import WorkerConnection
from mainspring.worker.torch_worker import TorchWorker


def test_actions_and_results_round_trip_with_tensor_frames() -> None:
    samples = [{"x": np.arange(6, dtype=np.float32).reshape(1, 6), "ids": np.array([[7, 8]], dtype=np.int64)}] * 2
    action = Infer(3, 0, "m", 10, 20, 5, (1, 2), 2)
    frames = encode(Act(action, metas_of(samples)), samples)
    assert len(frames) == 1 + 4
    message, decoded = decode([bytes(f) for f in frames])
    assert message == Act(action, metas_of(samples))
    assert decoded is not None and len(decoded) == 2
    np.testing.assert_array_equal(decoded[1]["ids"], samples[1]["ids"])
    assert decoded[0]["x"].flags.writeable  # a runtime may hand it straight to torch
    result = ActionResult(3, 0, ActionStatus.OK, Timing(1, 2))
    message, outputs = decode([bytes(f) for f in encode(Result(result, metas_of(samples[:1])), samples[:1])])
    assert isinstance(message, Result) and message.result == result and outputs is not None
    with pytest.raises(ValueError, match="tensor frames"):
        decode([bytes(f) for f in encode(Act(action, metas_of(samples)), samples)][:-1])


def test_clock_sync_trusts_the_fastest_round_trip() -> None:
    sync = ClockSync(window=4)
    offset = 5 * NS_PER_S
    sync.observe(0, offset + 5_000, 10_000)  # symmetric 10 us round trip
    sync.observe(100_000, offset + 100_000 + 900_000, 1_000_000 + 100_000)  # slow and lopsided
    assert sync.rtt_ns == 10_000 and sync.offset_ns == offset
    assert sync.to_worker(1_000) == offset + 1_000 and sync.to_controller(offset + 1_000) == 1_000


SHIFT_NS = 5 * NS_PER_S


class ShiftedClock(WallClock):
    """A worker host whose monotonic clock reads 5 s ahead of the controller's."""

    def now_ns(self) -> int:
        return super().now_ns() + SHIFT_NS


class Events:
    def __init__(self) -> None:
        self.joined: asyncio.Future[tuple[WorkerHandle, list[DeviceSpec], list[ModelInfo]]] | None = None
        self.results: dict[int, asyncio.Future[ActionResult]] = {}

    def on_join(self, handle: WorkerHandle, devices: list[DeviceSpec], models: list[ModelInfo], errors: Any) -> None:
        assert self.joined is not None
        self.joined.set_result((handle, devices, models))

    def on_result(self, handle: WorkerHandle, result: ActionResult) -> None:
        self.results[result.action_id].set_result(result)

    def on_model_reply(self, handle: WorkerHandle, reply: ModelReply) -> None:
        pass

    def on_lost(self, handle: WorkerHandle) -> None:
        pass

    def on_bad_message(self, handle: WorkerHandle, problem: str) -> None:
        pass

    def rejoin_wait_s(self, name: str) -> float:
        return 0.0


class EstimatedOffsets(Events):
    """Also how far off the hub's estimate of the worker's clock offset was (and the round trip it came from)
    when each result's timing was translated with it: the worker's clock reads exactly ``SHIFT_NS`` ahead."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: dict[int, tuple[int, int]] = {}

    def on_result(self, handle: WorkerHandle, result: ActionResult) -> None:
        assert isinstance(handle, RemoteWorker)
        self.errors[result.action_id] = estimate_error(handle)
        super().on_result(handle, result)


def estimate_error(handle: RemoteWorker) -> tuple[int, int]:
    """How far off the offset estimate is now, and the round trip it came from."""
    assert handle.sync.rtt_ns is not None
    return handle.sync.offset_ns - SHIFT_NS, handle.sync.rtt_ns


def test_hub_translates_windows_into_a_shifted_worker_clock(small_zoo: ModelRepository) -> None:
    async def scenario() -> None:
        events = EstimatedOffsets()
        events.joined = asyncio.get_running_loop().create_future()
        hub = WorkerHub("tcp://127.0.0.1:0", events, heartbeat_s=0.05)
        await hub.start()
        clock = ShiftedClock()
        connection = WorkerConnection(
            hub.endpoint,
            lambda sink: TorchWorker(small_zoo, sink, models=["mlp"], pool_bytes=64 * MIB, clock=clock),
            name="shifted",
            clock=clock,
        )
        thread = threading.Thread(target=connection.serve, daemon=True)
        thread.start()
        handle, devices, models = await asyncio.wait_for(events.joined, 60)
        assert [m.config.name for m in models] == ["mlp"] and devices[0].kind == "cpu"
        controller = WallClock()

        async def run(action: Any, inputs: Any = None) -> ActionResult:
            events.results[action.action_id] = asyncio.get_running_loop().create_future()
            handle.send_action(action, inputs)
            return await asyncio.wait_for(events.results[action.action_id], 30)

        assert isinstance(handle, RemoteWorker)
        window_error, window_rtt = estimate_error(handle)  # of the estimate the window goes out with
        now = controller.now_ns()
        load = await run(LoadWeights(1, 0, "mlp", now + 20 * NS_PER_MS, now + NS_PER_S, 0))
        assert load.status is ActionStatus.OK, load.message  # untranslated, the window would have closed 4 s ago
        # An estimate is off by at most half the round trip it came from (however slow that was) ...
        timing_error, timing_rtt = events.errors[load.action_id]
        assert abs(window_error) <= window_rtt // 2 + 1 and abs(timing_error) <= timing_rtt // 2 + 1
        # ... and the load began after its window opened on the worker's clock and before its answer came, so on
        # the controller's clock the same holds but for those errors: the timing came back translated.
        assert load.timing is not None
        assert now + 20 * NS_PER_MS + window_error - timing_error <= load.timing.begin_ns
        assert load.timing.begin_ns <= controller.now_ns() - timing_error
        samples = sample_inputs(small_zoo.config("mlp"), 2)
        now = controller.now_ns()
        infer = await run(Infer(2, 0, "mlp", now, now + NS_PER_S, 0, (1, 2), 2), samples)
        assert infer.status is ActionStatus.OK and infer.outputs is not None and len(infer.outputs) == 2
        assert infer.outputs[0]["logits"].shape == (1, 10)  # type: ignore[index]
        await hub.close()
        await asyncio.to_thread(thread.join, 10)
        assert not thread.is_alive()  # the worker left when the controller said bye

    asyncio.run(scenario())
