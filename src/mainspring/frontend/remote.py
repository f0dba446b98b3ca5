"""The controller in another process, as a frontend process sees it (``frontend/process.py``): the
controller's end is ``controller/frontends.py``, a local ZeroMQ channel.

``RemoteController`` is the controller as the data plane sees it (``ControllerPort``): health and
metadata from the last ``State``, every other call a message and its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from mainspring.frontend.port import Answer, ServedModel, ServiceError
from mainspring.models.profile import ModelProfile
from mainspring.protocol import Response
from mainspring.protocol.tensors import Sample
from mainspring.telemetry.metrics import ModelStats
from mainspring.time import NS_PER_S
from mainspring.transport.batched import Batched
from mainspring.transport.frontend_messages import (
    RESTARTED,
    Answers,
    Applied,
    Ask,
    Dropped,
    Join,
    Refused,
    Reply,
    State,
    Submit,
    decode_frontend,
)
from mainspring.transport.messages import CodecError, encode, metas_of
from mainspring.transport.security import secure_worker, tcp_secret

log = logging.getLogger("mainspring.frontend.remote")  # also when run as __main__

ANSWER_GRACE_S = 5.0  # past a call's own bound (its deadline, the model operation's timeout)
DROPPED_EVERY_S = 1.0  # clients dropped are told the controller together, at most this often


class RemoteController:
    """The controller in another process, over a DEALER socket connected to ``endpoint``."""

    def __init__(self, endpoint: str, name: str, secret: str = "", on_gone: Callable[[], None] | None = None) -> None:
        self.endpoint = endpoint
        self.name = name
        # Told when a local (ipc://) controller's end of the channel closes: its process is gone. A process
        # that did not start it learns so at once, not at the next run's first signal.
        self._on_gone = on_gone if endpoint.startswith("ipc://") else None
        self._peer_watch: asyncio.Task[None] | None = None
        self._secret = secret  # the worker secret, where the channel is a TCP port (cells on Ray)
        self.models: dict[str, ServedModel] = {}
        self.device_count = 0
        self.pool_bytes = 0  # its devices' weight pools together (0: a controller that does not say)
        self.accepting = False
        self.load_errors: dict[str, str] = {}
        self.default_slo_ns = 0
        self.in_line = True  # a cell: serves what the other cells serve (``CellsPort``)
        self._socket: zmq.asyncio.Socket | None = None
        self._batched: Batched | None = None  # the socket read and written without a future per message
        self._calls = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[tuple[Any, list[dict[str, Any]] | None]]] = {}
        self._joined = asyncio.Event()
        self._dropped: Counter[tuple[str, str]] = Counter()
        self._dropped_due: asyncio.TimerHandle | None = None
        self._sends: set[asyncio.Task[Any]] = set()

    @property
    def joined(self) -> bool:
        """The controller took this frontend in (its state came)."""
        return self._joined.is_set()

    async def start(self, timeout_s: float = 30.0) -> None:
        self._open()
        self._send(encode(Join(self.name)))
        await asyncio.wait_for(self._joined.wait(), timeout_s)

    def _open(self) -> None:
        """A fresh socket to the controller, read from now on (not joined yet: ``start`` says hello)."""
        socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if tcp_secret(self.endpoint, self._secret):
            secure_worker(socket, self._secret)
        if self._on_gone is not None:
            self._peer_watch = asyncio.create_task(self._watch_peer(socket, self._on_gone))
        socket.connect(self.endpoint)
        self._socket = socket
        self._batched = Batched(socket, self._take)
        self._batched.start()

    def _send(self, frames: list[Any]) -> None:
        """Queue a message for the controller now; ``ServiceError`` when it cannot take more (a thousand
        messages it has not read: it is stuck or gone) or this frontend has no socket to it."""
        if self._batched is None:
            raise ServiceError("unavailable", "the controller is gone; this frontend joins it again when it is back",
                               never_ran=True)  # fmt: skip
        try:
            self._batched.send(frames)
        except zmq.Again:
            raise ServiceError("overloaded", "the controller has not read the calls sent to it; try later",
                               never_ran=True) from None  # fmt: skip

    def fail_waiting(self, reason: str) -> int:
        """The controller is gone: every call waiting on it fails now with ``unavailable`` (it will not be
        answered: a restarted controller never received it), instead of at its bound."""
        waiting = [f for f in self._waiting.values() if not f.done()]
        for future in waiting:
            future.set_exception(ServiceError("unavailable", reason, never_ran=True))
        self._waiting.clear()
        return len(waiting)

    async def disconnect(self) -> None:
        """Drop the socket to a controller that died, and what was queued on it for that controller."""
        await self._stop_receiving()

    async def rejoin(self) -> None:
        """Join a restarted controller on a fresh socket (after ``disconnect``, or the old one is dropped
        here): nothing queued for the process that died reaches the new one."""
        self.fail_waiting("the controller was restarted")
        await self._stop_receiving()
        self._joined.clear()
        await self.start()

    async def _watch_peer(self, socket: zmq.asyncio.Socket, on_gone: Callable[[], None]) -> None:
        monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            while True:
                await monitor.recv_multipart()  # an EVENT_DISCONNECTED, the only event asked for
                on_gone()
        finally:
            socket.disable_monitor()
            monitor.close(0)

    async def _stop_receiving(self) -> None:
        batched, socket, watch = self._batched, self._socket, self._peer_watch
        self._batched = self._socket = self._peer_watch = None
        if watch is not None:  # first: closing the socket here is no peer's exit
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        if batched is not None:
            batched.stop()
        if socket is not None:
            socket.close(0)

    async def close(self) -> None:
        if self._dropped_due is not None:  # what is counted still goes to the controller
            self._dropped_due.cancel()
            self._send_dropped()
        if self._sends:
            await asyncio.wait(self._sends, timeout=1.0)
        await self._stop_receiving()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ServiceError("unavailable", "the frontend is shutting down"))

    def _take(self, frames: list[zmq.Frame]) -> None:
        try:
            message, samples = decode_frontend([frame.buffer for frame in frames])
        except CodecError as error:
            log.warning("dropped a message from the controller: %s", error)
            return
        if isinstance(message, State):
            self._apply(message)
            with contextlib.suppress(ServiceError):  # gone meanwhile: the next controller sends its state again
                self._send(encode(Applied(message.seq)))
        elif isinstance(message, Answers | Refused | Reply):
            future = self._waiting.pop(message.call, None)
            if future is not None and not future.done():
                future.set_result((message, samples))

    def _apply(self, state: State) -> None:
        self.models = {
            info.config.name: ServedModel(info.config, ModelProfile.from_json(info.profile, "controller"), info.version)
            for info in state.models
        }
        self.device_count = state.device_count
        self.pool_bytes = state.pool_bytes
        self.accepting = state.accepting
        self.load_errors = dict(state.load_errors)
        self.default_slo_ns = state.default_slo_ns
        self.in_line = state.in_line
        self._joined.set()

    async def _call(
        self, call: int, message: msgspec.Struct, timeout_s: float, samples: Sequence[Sample] | None = None
    ) -> tuple[Any, list[dict[str, Any]] | None]:
        """Send ``message`` and wait for its answer, at most ``timeout_s``: a controller that is gone or
        stuck must not hold a client's call without a bound."""
        self._send(encode(message, samples))
        future: asyncio.Future[tuple[Any, list[dict[str, Any]] | None]] = asyncio.get_running_loop().create_future()
        self._waiting[call] = future
        try:
            reply, tensors = await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise ServiceError("unavailable", f"the controller did not answer within {timeout_s:.1f} s") from None
        finally:
            self._waiting.pop(call, None)
        if isinstance(reply, Refused) and reply.kind == RESTARTED:
            raise ServiceError("unavailable", reply.message, never_ran=True)
        if isinstance(reply, Refused):
            raise ServiceError(reply.kind, reply.message)
        return reply, tensors

    # --- ControllerPort ---------------------------------------------------------------------------
    async def infer(
        self, model: str, samples: Sequence[Sample], slo_ns: int, waited_ns: int = 0, traceparent: str = ""
    ) -> list[Answer]:
        call = next(self._calls)
        # Every request is answered by its deadline at the latest; past that and a grace, the controller is gone.
        timeout_s = slo_ns / NS_PER_S + ANSWER_GRACE_S
        submit = Submit(call, model, slo_ns, metas_of(samples), waited_ns, traceparent)
        reply, outputs = await self._call(call, submit, timeout_s, samples)
        assert isinstance(reply, Answers) and outputs is not None
        return [
            (Response(0, outcome, reason), output)
            for outcome, reason, output in zip(reply.outcomes, reply.reasons, outputs, strict=True)
        ]

    async def _ask(
        self,
        what: str,
        model: str = "",
        seconds: float = 0.0,
        timeout_s: float = 10.0,
        models: Sequence[str] = (),
        cursor: str = "",
    ) -> Any:
        call = next(self._calls)
        reply, _ = await self._call(call, Ask(call, what, model, seconds, tuple(models), cursor), timeout_s)
        assert isinstance(reply, Reply)
        return reply.value

    async def refresh(self) -> bool:
        await self._ask("state")  # the controller sends its state first, on the same socket
        return True

    async def load_model(self, model: str, timeout_s: float = 120.0) -> None:
        await self._ask("load", model, timeout_s=timeout_s + ANSWER_GRACE_S)

    async def reload_model(self, model: str, timeout_s: float = 120.0) -> None:
        await self._ask("reload", model, timeout_s=timeout_s + ANSWER_GRACE_S)

    async def unload_model(self, model: str, timeout_s: float = 60.0) -> None:
        await self._ask("unload", model, timeout_s=timeout_s + ANSWER_GRACE_S)

    async def signal_models(self, models: Sequence[str]) -> None:
        """Tell a cell which of its models its load signal is to carry: those it serves with other cells
        (the plan's ``shared``); routing reads the signal for no other."""
        await self._ask("signal_models", models=models)

    async def mark_in_line(self) -> None:
        """Tell a cell it serves what the other cells serve: every frontend may route to it now."""
        await self._ask("in_line")

    async def warm(self, model: str) -> bool:
        """Ask the controller to load ``model`` before its requests come (``ControllerService.warm``)."""
        return bool(await self._ask("warm", model))

    async def model_statistics(self, model: str) -> ModelStats:
        return ModelStats(**await self._ask("statistics", model))

    async def exposition(self) -> bytes:
        value = await self._ask("metrics")
        assert isinstance(value, bytes)
        return value

    def count_dropped_client(self, transport: str, cause: str) -> None:
        self._dropped[transport, cause] += 1
        if self._dropped_due is None:
            self._dropped_due = asyncio.get_running_loop().call_later(DROPPED_EVERY_S, self._send_dropped)

    def _send_dropped(self) -> None:
        self._dropped_due = None
        counts = [(transport, cause, n) for (transport, cause), n in self._dropped.items()]
        self._dropped.clear()
        task = asyncio.create_task(self._tell(Dropped(counts)))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _tell(self, message: msgspec.Struct) -> None:
        """Send ``message``, which has no answer."""
        with contextlib.suppress(ServiceError):  # gone: what it would have said is lost with it
            self._send(encode(message))

    async def timeline_view(self, seconds: float, cursor: str = "") -> dict[str, Any]:
        value = await self._ask("timeline", seconds=seconds, cursor=cursor)
        assert isinstance(value, dict)
        return value
