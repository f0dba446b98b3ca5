"""The worker process: a ``Worker`` behind a ZeroMQ DEALER socket (``mainspring worker``).

One I/O thread owns the socket. Results come from the lane threads through a queue and
a self-pipe that wakes the poller, so a result leaves as soon as it is ready. Pings are
answered at once with this process's clock (the controller estimates the offset).
Model loads and unloads from the repository API run on their own thread so that a slow
registration never delays a ping or a result.

When the controller says bye or falls silent, a worker that may ``rejoin`` lets its actions in
flight finish (their results are dropped: the next controller never sent them), then says hello
again on a new socket, listing the models each device still holds, so a restarted controller
picks up where the weights are instead of loading everything again. ``serve`` returns
``START_OVER`` instead when the controller asks for a fresh process (a lane hung), the actions
in flight do not finish, or a device's CUDA context is lost (``start_over``; ``mainspring worker``
then re-executes itself, or exits to be started again by its parent).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from mainspring.protocol import ActionResult
from mainspring.time import Clock, WallClock
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
from mainspring.transport.security import secure_worker
from mainspring.worker.api import Worker, apply_model_operation, model_info

log = logging.getLogger(__name__)

Outgoing = tuple[Message, list[Any] | None]
STOPPED, CONTROLLER_GONE, START_OVER = "stopped", "controller gone", "start over"
HELLO_RETRY_S = 1.0  # a hello can reach a controller that is closing: say it again until one answers
UNANSWERED_WARN_S = 10.0  # no answer to the hellos this long: tell the user what is likely wrong
DRAIN_TIMEOUT_S = 15.0  # longer than any action waits for its window (the executor's 10 s) plus its run


class WorkerConnection:
    """Connects a ``TorchWorker`` to a controller and serves until told to stop."""

    def __init__(
        self,
        address: str,
        make_worker: Callable[[Callable[[ActionResult], None]], Worker],
        name: str | None = None,
        clock: Clock | None = None,
        secret: str = "",
    ) -> None:
        self.address = address
        self._secret = secret
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._clock = clock or WallClock()
        self._outgoing: queue.SimpleQueue[Outgoing] = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._pipe_closed = False
        self._stop = threading.Event()
        self._starting_over = False
        self._in_flight: set[int] = set()  # action ids submitted and not yet reported
        self._in_flight_lock = threading.Lock()
        self.worker = make_worker(self._on_result)

    def _send_later(self, message: Message, samples: list[Any] | None = None) -> None:
        self._outgoing.put((message, samples))
        if self._pipe_closed:  # serve has returned: nobody to wake (and the number may be another file's now)
            return
        with contextlib.suppress(BlockingIOError):  # a full pipe: the I/O thread is awake anyway
            os.write(self._wake_write, b"x")

    def _on_result(self, result: ActionResult) -> None:
        with self._in_flight_lock:
            self._in_flight.discard(result.action_id)
        # Outputs travel as tensor frames, not inside the header.
        bare = msgspec.structs.replace(result, outputs=None)
        outputs = result.outputs
        if outputs is not None and all(isinstance(o, dict) for o in outputs):
            samples: list[Any] = list(outputs)
            self._send_later(Result(bare, metas_of(samples)), samples)
        else:
            self._send_later(Result(bare))

    def stop(self) -> None:
        self._stop.set()
        self._send_later(Bye())

    def start_over(self, reason: str) -> None:
        """This process cannot serve any more (a device's CUDA context is lost): send the results already
        queued, stop, and have ``serve`` return ``START_OVER`` so that a fresh process takes over."""
        log.critical("worker %s starts over in a fresh process: %s", self.name, reason)
        self._starting_over = True
        self.stop()

    def serve(
        self, parent_pid: int | None = None, controller_timeout_s: float | None = None, rejoin: bool = False
    ) -> str:
        """Say hello, then relay actions and results until ``stop()`` or the parent process dies
        (``STOPPED``), or the controller says bye or, once heard, is silent for ``controller_timeout_s``
        (``CONTROLLER_GONE``; with ``rejoin``, say hello again instead, or ``START_OVER``)."""
        try:
            while True:
                outcome = self._session(parent_pid, controller_timeout_s)
                if self._starting_over:
                    return START_OVER
                if outcome != CONTROLLER_GONE or not rejoin:
                    return outcome
                if not self._drain(DRAIN_TIMEOUT_S):
                    log.warning("actions still in flight after %.0f s; starting over", DRAIN_TIMEOUT_S)
                    return START_OVER
                log.info("rejoining %s with the weights held now", self.address)
        finally:
            self.worker.close()
            self._pipe_closed = True
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _drain(self, timeout_s: float) -> bool:
        """Wait for the actions in flight to report, then drop everything the old controller was owed."""
        deadline = time.monotonic() + timeout_s
        while self._in_flight and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.02)
        while True:
            try:
                self._outgoing.get_nowait()
            except queue.Empty:
                break
        return not self._in_flight

    def _session(self, parent_pid: int | None, controller_timeout_s: float | None) -> str:
        """One connection to the controller, from hello to stop or the controller's going."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt_string(zmq.IDENTITY, self.name)
        if self._secret:
            secure_worker(sock, self._secret)
        sock.connect(self.address)
        with contextlib.suppress(zmq.Again):  # as the retries below: with no connection up a send would hang
            sock.send_multipart(encode(self._hello()), flags=zmq.NOBLOCK)
        said_hello = time.monotonic()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        log.info("worker %s connecting to %s", self.name, self.address)
        outcome = STOPPED
        heard: float | None = None  # monotonic time of the controller's last message; None until the first
        warn_at = said_hello + UNANSWERED_WARN_S
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(200))
                if parent_pid is not None and os.getppid() != parent_pid:
                    log.warning("parent process %d is gone; stopping", parent_pid)
                    break
                if (
                    heard is not None
                    and controller_timeout_s is not None
                    and time.monotonic() - heard > controller_timeout_s
                ):
                    log.warning("controller silent for %.1f s", time.monotonic() - heard)
                    outcome = CONTROLLER_GONE
                    break
                if heard is None and time.monotonic() - said_hello > HELLO_RETRY_S:
                    # Not blocking: with no connection up (a refused handshake) a send would hang here.
                    with contextlib.suppress(zmq.Again):
                        sock.send_multipart(encode(self._hello()), flags=zmq.NOBLOCK)
                    said_hello = time.monotonic()
                if heard is None and said_hello > warn_at:  # a CURVE handshake that fails is silent on this side
                    secret = "the same worker secret" if self._secret else "a worker secret (none set here)"
                    log.warning("no answer from %s for %.0f s: is the controller up, and does it expect %s? "
                                "(MAINSPRING_WORKER_SECRET; a worker it dropped hears back only after a backoff of "
                                "up to a minute)", self.address, UNANSWERED_WARN_S, secret)  # fmt: skip
                    warn_at = float("inf")
                if self._wake_read in events:
                    os.read(self._wake_read, 4096)
                self._send_outgoing(sock)
                while sock.poll(0, zmq.POLLIN):
                    if heard is None:
                        log.info("worker %s: the controller at %s answered", self.name, self.address)
                    heard = time.monotonic()
                    said_bye = self._handle(sock, sock.recv_multipart(copy=True))
                    if said_bye is not None:
                        outcome = said_bye
                        break
                if outcome != STOPPED:
                    break
            if outcome == STOPPED:  # what finished before the stop still goes out (the socket lingers 1 s)
                self._send_outgoing(sock)
        finally:
            # A controller that is gone is owed nothing: what its socket still queues (results, pongs) must
            # not reach the next one on that address, ahead of or beside this worker's new hello.
            sock.close(linger=None if outcome == STOPPED else 0)
        return outcome

    def _send_outgoing(self, sock: zmq.Socket[bytes]) -> None:
        while True:
            try:
                message, samples = self._outgoing.get_nowait()
            except queue.Empty:
                return
            if not isinstance(message, Bye):  # a wake-up only: the controller hears of a stop by the silence
                sock.send_multipart(encode(message, samples), copy=False)

    def _hello(self) -> Hello:
        models = [model_info(self.worker, m) for m in self.worker.profiles()]
        devices = [
            msgspec.structs.replace(spec, resident=tuple(sorted(self.worker.resident_models(spec.device))))
            for spec in self.worker.devices
        ]
        return Hello(self.name, devices, models, dict(self.worker.load_errors))

    def _handle(self, sock: zmq.Socket[bytes], frames: list[bytes]) -> str | None:
        """Act on one message; the outcome if the controller said bye."""
        try:
            message, samples = decode(frames)
        except CodecError as error:  # the controller speaks another version, or a bug: drop it, keep serving
            log.warning("dropped a message from the controller: %s", error)
            return None
        if isinstance(message, Act):
            with self._in_flight_lock:
                self._in_flight.add(message.action.action_id)
            self.worker.submit(message.action, samples)
        elif isinstance(message, Ping):
            sock.send_multipart(encode(Pong(message.controller_ns, self._clock.now_ns(), self.worker.gpu_memory())))
        elif isinstance(message, ModelOp):
            threading.Thread(target=self._model_op, args=(message,), name="model-op", daemon=True).start()
        elif isinstance(message, Bye):
            log.info("controller said bye: %s", message.reason)
            return START_OVER if message.start_over else CONTROLLER_GONE
        return None

    def _model_op(self, op: ModelOp) -> None:
        self._send_later(apply_model_operation(self.worker, op.op_id, op.op, op.target))
