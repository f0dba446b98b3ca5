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
from mainspring.transport.zmq_hub import WorkerHub
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


class ShiftedClock(WallClock):
    """A worker host whose monotonic clock reads 5 s ahead of the controller's."""

    def now_ns(self) -> int:
        return super().now_ns() + 5 * NS_PER_S


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


def test_hub_translates_windows_into_a_shifted_worker_clock(small_zoo: ModelRepository) -> None:
    async def scenario() -> None:
        events = Events()
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

        now = controller.now_ns()
        load = await run(LoadWeights(1, 0, "mlp", now + 20 * NS_PER_MS, now + NS_PER_S, 0))
        assert load.status is ActionStatus.OK, load.message  # untranslated, the window would have closed 4 s ago
        # Within the error of the offset estimate (half the asymmetry of one round trip right after joining).
        assert (
            load.timing is not None
            and now + 15 * NS_PER_MS <= load.timing.begin_ns <= controller.now_ns() + 5 * NS_PER_MS
        )
        samples = sample_inputs(small_zoo.config("mlp"), 2)
        now = controller.now_ns()
        infer = await run(Infer(2, 0, "mlp", now, now + NS_PER_S, 0, (1, 2), 2), samples)
        assert infer.status is ActionStatus.OK and infer.outputs is not None and len(infer.outputs) == 2
        assert infer.outputs[0]["logits"].shape == (1, 10)  # type: ignore[index]
        await hub.close()
        await asyncio.to_thread(thread.join, 10)
        assert not thread.is_alive()  # the worker left when the controller said bye

    asyncio.run(scenario())
