"""The controller's end of the ZeroMQ transport: one ROUTER socket on the asyncio loop.

Workers connect with DEALER sockets and say ``Hello``. A worker is announced (``on_join``)
after its first pong, once its clock offset is known; from then on action windows are
translated into its clock and result timings back. Every ``heartbeat_s`` each worker is
pinged; one silent for ``timeout_s`` is reported lost and forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from mainspring.protocol import Action, ActionResult, Infer, Timing
from mainspring.protocol.devices import GpuMemory
from mainspring.protocol.models import ModelOperation, ModelReply, ModelTarget
from mainspring.time import NO_LEDGER, Clock, CpuLedger, WallClock, s_to_ns
from mainspring.transport.batched import Batched
from mainspring.transport.clock_sync import ClockSync
from mainspring.transport.links import WorkerEvents
from mainspring.transport.messages import (
    Act,
    Bye,
    CodecError,
    Hello,
    Message,
    ModelOp,
    Ping,
    Pong,
    Result,
    decode,
    encode,
    metas_of,
)
from mainspring.transport.security import (
    HANDSHAKE_FAILED,
    HANDSHAKE_LOG_EVERY_S,
    report_failed_handshakes,
    secure_controller,
)

log = logging.getLogger(__name__)


class RemoteWorker:
    """A worker behind the hub's socket (a ``WorkerHandle``)."""

    def __init__(self, hub: WorkerHub, identity: bytes, hello: Hello, now_ns: int) -> None:
        self.name = hello.worker
        self.identity = identity
        self.hello = hello
        self.sync = ClockSync()
        self.last_seen_ns = now_ns
        self.joined = False
        self.gpus: tuple[GpuMemory, ...] = ()  # as its latest pong said
        self._hub = hub

    def send_action(self, action: Action, inputs: list[Any] | None) -> None:
        to_worker = self.sync.to_worker
        times: dict[str, Any] = {"earliest_ns": to_worker(action.earliest_ns), "latest_ns": to_worker(action.latest_ns)}
        if isinstance(action, Infer) and action.deadlines_ns:
            times["deadlines_ns"] = tuple(to_worker(d) for d in action.deadlines_ns)
        translated = msgspec.structs.replace(action, **times)
        metas = metas_of(inputs) if inputs is not None else None
        self._hub.send(self, Act(translated, metas), inputs)

    def model_op(self, op_id: int, op: ModelOperation, target: ModelTarget) -> None:
        self._hub.send(self, ModelOp(op_id, op, target))

    def close(self, reason: str, start_over: bool = False) -> None:
        """Say bye and stop pinging: the worker leaves on its own, which is not a loss."""
        self._hub.send(self, Bye(reason, start_over))
        self._hub.forget(self)


class _StrayLog:
    """Frames from peers that never joined: the first warning at once, then at most one per
    ``HANDSHAKE_LOG_EVERY_S`` with how many were held back (a flood must not flood the log)."""

    def __init__(self) -> None:
        self._last = float("-inf")
        self._held = 0

    def report(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last < HANDSHAKE_LOG_EVERY_S:
            self._held += 1
            return
        more = f" ({self._held} more such since the last warning)" if self._held else ""
        log.warning("%s%s", text, more)
        self._last, self._held = now, 0


class WorkerHub:
    def __init__(
        self,
        address: str,
        events: WorkerEvents,
        heartbeat_s: float = 0.1,
        timeout_s: float = 2.0,
        clock: Clock | None = None,
        secret: str = "",
        ledger: CpuLedger = NO_LEDGER,
    ) -> None:
        self.address = address
        self._receive_part = ledger.part("receive")  # decoding what workers send, and handing it on
        self._events = events
        self._heartbeat_s = heartbeat_s
        self._timeout_ns = s_to_ns(timeout_s)
        self._clock = clock or WallClock()
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unknown or gone peer raises instead of dropping
        # A worker that reconnects (a new socket, the same name) takes its name over from the old connection,
        # which may not have closed yet; without this the new one is ignored.
        self._socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._batched = Batched(self._socket, self._take, copy=True)  # no future per message (``batched.py``)
        self._secret = secret
        self._authenticator: AsyncioAuthenticator | None = None
        self._monitor: zmq.asyncio.Socket | None = None  # handshake failures (``report_failed_handshakes``)
        self._workers: dict[bytes, RemoteWorker] = {}
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._stray = _StrayLog()

    @property
    def endpoint(self) -> str:
        """The bound address (with the real port when bound to port 0)."""
        value = self._socket.getsockopt(zmq.LAST_ENDPOINT)
        return value.decode() if isinstance(value, bytes) else str(value)

    async def start(self) -> None:
        if self._secret:  # the authenticator runs on this loop, so it starts here and not in __init__
            self._authenticator = secure_controller(self._context, self._socket, self._secret)
        try:
            self._socket.bind(self.address)
        except zmq.ZMQError as error:
            raise OSError(f"cannot listen for workers on {self.address}: {error.strerror}") from None
        self._monitor = self._socket.get_monitor_socket(HANDSHAKE_FAILED)
        watch = report_failed_handshakes(self._monitor, self.endpoint, bool(self._secret))
        self._batched.start()
        self._tasks = [asyncio.create_task(c) for c in (self._heartbeat(), watch)]
        log.info("waiting for workers on %s", self.endpoint)

    async def close(self, reason: str = "controller shutting down") -> None:
        self._closing = True
        for worker in list(self._workers.values()):
            worker.close(reason)
        await asyncio.sleep(0.05)  # let the byes leave
        self._batched.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._monitor is not None:
            self._socket.disable_monitor()
            self._monitor.close()
        self._socket.close()
        if self._authenticator is not None:
            self._authenticator.stop()
        self._context.term()

    def send(self, worker: RemoteWorker, message: Message, samples: list[Any] | None = None) -> None:
        try:
            self._batched.send([worker.identity, *encode(message, samples)])
        except zmq.Again as error:  # a thousand messages it has not taken: it reads no more
            self._unreachable(worker, error)
        except zmq.ZMQError as error:
            self._unreachable(worker, error)

    def _unreachable(self, worker: RemoteWorker, error: BaseException | None) -> None:
        """ZeroMQ dropped the peer (its connection closed): lost now, without waiting for the heartbeat timeout."""
        if worker.identity in self._workers:
            log.warning("worker %s unreachable (%s): lost", worker.name, error)
            self._lose(worker)

    def _take(self, message: list[Any]) -> None:
        identity, *frames = message
        try:
            with self._receive_part:
                self._dispatch(identity, frames)
        except Exception:  # a bug must not stop the controller
            log.exception("could not handle a message from worker %r", identity)

    def _dispatch(self, identity: bytes, frames: list[bytes]) -> None:
        worker = self._workers.get(identity)
        try:
            message, samples = decode(frames)
        except CodecError as error:
            if worker is not None and worker.joined:  # its actions' results may never come: drop it now
                self._events.on_bad_message(worker, str(error))
            else:
                self._stray.report(f"frames from a peer that has not joined ({identity!r}) dropped: {error}")
            return
        now = self._clock.now_ns()
        if isinstance(message, Hello):
            if self._closing:
                return  # a worker rejoining too soon: it says hello again, to the next controller
            if self._events.rejoin_wait_s(message.worker) > 0:
                return  # dropped lately: its hellos go unanswered until its backoff runs out
            if worker is not None and worker.joined:
                self._lose(worker)  # the same worker restarted: what it had in flight is gone
            worker = self._workers[identity] = RemoteWorker(self, identity, message, now)
            self.send(worker, Ping(now))
            return
        if worker is None:
            return  # a worker we already declared lost: it must say hello again
        worker.last_seen_ns = now
        if isinstance(message, Pong):
            worker.sync.observe(message.controller_ns, message.worker_ns, now)
            worker.gpus = message.gpus
            if not worker.joined:
                worker.joined = True
                hello = worker.hello
                self._events.on_join(worker, list(hello.devices), list(hello.models), dict(hello.load_errors))
        elif isinstance(message, Result):
            self._events.on_result(worker, _to_controller_clock(message.result, worker.sync, samples))
        elif isinstance(message, ModelReply):
            self._events.on_model_reply(worker, message)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            now = self._clock.now_ns()
            for worker in list(self._workers.values()):
                if now - worker.last_seen_ns > self._timeout_ns:
                    log.warning("worker %s silent for %.1f s: lost", worker.name, (now - worker.last_seen_ns) / 1e9)
                    self._lose(worker)
                else:
                    self.send(worker, Ping(now))

    def forget(self, worker: RemoteWorker) -> None:
        self._workers.pop(worker.identity, None)

    def _lose(self, worker: RemoteWorker) -> None:
        self._workers.pop(worker.identity, None)
        if worker.joined:
            self._events.on_lost(worker)


def _to_controller_clock(result: ActionResult, sync: ClockSync, samples: list[Any] | None) -> ActionResult:
    timing = result.timing
    if timing is not None:
        timing = Timing(sync.to_controller(timing.begin_ns), sync.to_controller(timing.end_ns))
    outputs: list[object] | None = list(samples) if samples is not None else None
    return msgspec.structs.replace(result, timing=timing, outputs=outputs)
