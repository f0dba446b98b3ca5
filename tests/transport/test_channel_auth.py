"""With a worker secret, only a worker that holds it can join (ZeroMQ CURVE, real sockets)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from mainspring.models.repository import ModelRepository
from mainspring.protocol.pages import MIB
from mainspring.transport.zmq_hub import WorkerHub
from mainspring.worker import process
from mainspring.worker.process import WorkerConnection
from mainspring.worker.torch_worker import TorchWorker
from tests.transport.test_transport import Events


async def joins(small_zoo: ModelRepository, hub_secret: str, worker_secret: str, wait_s: float) -> bool:
    events = Events()
    events.joined = asyncio.get_running_loop().create_future()
    hub = WorkerHub("tcp://127.0.0.1:0", events, heartbeat_s=0.05, secret=hub_secret)
    await hub.start()
    connection = WorkerConnection(
        hub.endpoint,
        lambda sink: TorchWorker(small_zoo, sink, models=["mlp"], pool_bytes=64 * MIB),
        name=f"worker-{worker_secret or 'none'}",
        secret=worker_secret,
    )
    thread = threading.Thread(target=connection.serve, daemon=True)
    thread.start()
    try:
        await asyncio.wait_for(events.joined, wait_s)
        return True
    except TimeoutError:
        return False
    finally:
        connection.stop()
        await asyncio.to_thread(thread.join, 10)
        await hub.close()


@pytest.mark.parametrize(
    ("hub_secret", "worker_secret", "joined"),
    [("s3cret", "s3cret", True), ("s3cret", "guess", False), ("s3cret", "", False), ("", "", True), ("", "x", False)],
    ids=["same-secret", "wrong-secret", "no-secret", "plain", "secret-where-none"],
)
def test_only_a_worker_with_the_secret_joins(
    small_zoo: ModelRepository,
    hub_secret: str,
    worker_secret: str,
    joined: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A refused handshake is silent on the wire (ZeroMQ retries); 5 s is 100 heartbeats of the hub.
    monkeypatch.setattr(process, "UNANSWERED_WARN_S", 0.5)
    caplog.set_level(logging.INFO, "mainspring.worker.process")
    caplog.set_level(logging.INFO, "mainspring.transport.security")
    assert asyncio.run(joins(small_zoo, hub_secret, worker_secret, 30.0 if joined else 5.0)) is joined
    # ... so the worker says what is likely wrong, instead of a "connected" it never was.
    warned = "no answer from tcp://127.0.0.1:" in caplog.text and "(MAINSPRING_WORKER_SECRET)" in caplog.text
    assert warned is not joined and ("answered" in caplog.text) is joined
    if not joined:
        assert ("(none set here)" in caplog.text) is (worker_secret == "")
    # The controller says so too, with the likely cause (a refused handshake showed nothing there either).
    controller = [r.getMessage() for r in caplog.records if r.name == "mainspring.transport.security"]
    failed = [m for m in controller if "failed the handshake" in m]
    assert bool(failed) is not joined, controller
    if not joined:
        cause = {
            "guess": "its worker secret is not this controller's",
            "": "the connecting side has no worker secret; this controller has one",
            "x": "the connecting side has a worker secret; this controller has none",
        }[worker_secret]
        assert cause in failed[0] and "(MAINSPRING_WORKER_SECRET)" in failed[0]
        assert len(failed) <= 2  # retries every 0.1 s are counted, not logged one by one
