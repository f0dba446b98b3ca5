"""What workers tell the controller for Triton's metrics: their GPUs' memory with each heartbeat, and how long each
model took them to load before they joined. A real ``WorkerHub`` on loopback and a peer speaking the protocol
(this machine has no GPU: the torch side is ``tests/worker/test_cuda.py``'s), then a real CPU ``TorchWorker``."""

from __future__ import annotations

import asyncio
import contextlib

import zmq
import zmq.asyncio

from mainspring.controller.service import ControllerService
from mainspring.models.repository import ModelRepository
from mainspring.protocol import DeviceSpec
from mainspring.protocol.devices import GpuMemory
from mainspring.protocol.models import ModelInfo
from mainspring.protocol.pages import MIB
from mainspring.time import NS_PER_MS, WallClock
from mainspring.transport.messages import Hello, Ping, Pong, decode, encode
from mainspring.transport.zmq_hub import WorkerHub
from mainspring.worker.inprocess import InProcessWorker
from mainspring.worker.torch_worker import TorchWorker
from tests.controller.test_rogue_worker import INFO
from tests.telemetry.exposition import samples
from tests.waiting import until

GPUS = (GpuMemory("GPU-5e0b7a1c-0000-4000-8000-000000000001", 3 * 1024**3, 80 * 1024**3),)


async def exposed(service: ControllerService) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    return samples((await service.exposition()).decode())


async def gpu_peer(endpoint: str, hello: Hello, gpus: tuple[GpuMemory, ...]) -> None:
    """Says ``hello``, then answers every ping with a pong that carries ``gpus``, as a CUDA worker does."""
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt_string(zmq.IDENTITY, hello.worker)
    socket.connect(endpoint)
    try:
        await socket.send_multipart(encode(hello))
        while True:
            message, _ = decode(await socket.recv_multipart())
            if isinstance(message, Ping):
                await socket.send_multipart(encode(Pong(message.controller_ns, WallClock().now_ns(), gpus)))
    finally:
        socket.close()
        context.term()


def test_a_workers_gpus_and_load_times_reach_metrics_and_leave_with_it() -> None:
    async def scenario() -> None:
        service = ControllerService()
        hub = WorkerHub("tcp://127.0.0.1:0", service.worker_events, heartbeat_s=0.05, timeout_s=60.0)
        await hub.start()
        info = ModelInfo(INFO.config, INFO.profile, load_ns=250 * NS_PER_MS)  # it took the worker 250 ms
        hello = Hello("gpu-worker", [DeviceSpec(0, "nvidia-h100", 64 * MIB, 16 * MIB)], [info])
        peer = asyncio.create_task(gpu_peer(hub.endpoint, hello, GPUS))
        try:
            await until(lambda: service.device_count == 1, 30)
            found = await exposed(service)
            uuid = (("gpu_uuid", GPUS[0].uuid),)
            assert found["nv_gpu_memory_used_bytes"] == {uuid: 3 * 1024**3}
            assert found["nv_gpu_memory_total_bytes"] == {uuid: 80 * 1024**3}
            assert found["nv_model_load_duration_secs"] == {(("model", "mlp"), ("version", "1")): 0.25}
            peer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await peer
            for handle in list(service.workers):  # gone: its GPUs with it (a silent worker is lost the same way)
                service.worker_events.on_lost(handle)
            found = await exposed(service)
            assert "nv_gpu_memory_used_bytes" not in found and "nv_gpu_memory_total_bytes" not in found
        finally:
            peer.cancel()
            await service.drain(1.0)
            await hub.close()

    asyncio.run(scenario())


def test_models_a_cpu_worker_loaded_before_joining_show_its_load_times_and_no_gpu(small_zoo: ModelRepository) -> None:
    async def scenario() -> None:
        service = ControllerService()
        handle = InProcessWorker(
            "cpu", lambda sink: TorchWorker(small_zoo, sink, ["cpu"], pool_bytes=256 * MIB), service.worker_events,
            asyncio.get_running_loop(),
        )  # fmt: skip
        handle.join()
        try:
            found = await exposed(service)
            loads = found["nv_model_load_duration_secs"]
            assert {dict(labels)["model"] for labels in loads} == set(small_zoo.models())
            assert all(0 < seconds < 600 for seconds in loads.values()), loads
            assert not any(name.startswith("nv_gpu_") for name in found)
        finally:
            await service.drain(1.0)
            handle.close("test over")

    asyncio.run(scenario())
