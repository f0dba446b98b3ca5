"""The controller's end of the frontend channel (``serve --frontends N``): one ROUTER socket.

Frontend processes decode HTTP and gRPC requests on cores of their own and hand each call to the
controller here (``Submit``, tensors as raw frames); the answers go back the same way. Health and
metadata they answer from a ``State`` the hub sends on join and whenever it changes; the rest
(repository, statistics, metrics, timeline) they ask for (``Ask``). The socket is an ``ipc://``
path in a folder only this user can enter, or with cells on Ray a TCP port, which the worker secret
guards when one is set (ZeroMQ CURVE, as the workers' channel).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from mainspring.controller.service import ControllerService
from mainspring.frontend.port import Answer, ServiceError
from mainspring.frontend.shedding import ArrivalGate, target_lag_ns
from mainspring.models.errors import ModelLoadError
from mainspring.protocol import Outcome
from mainspring.protocol.models import ModelInfo
from mainspring.protocol.tensors import Sample
from mainspring.transport.batched import MOST_PER_WAKE, Batched
from mainspring.transport.frontend_messages import (
    CAUSES,
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
from mainspring.transport.security import secure_controller, tcp_secret

log = logging.getLogger(__name__)
LATE_PER_WAKE = 16  # calls read per wake-up while the loop runs late (else ``MOST_PER_WAKE``)


class FrontendHub:
    """Serves frontend processes on ``endpoint`` for ``service``."""

    def __init__(self, service: ControllerService, endpoint: str, secret: str = "", shed: bool = True) -> None:
        """``shed``: refuse calls at once (429 ``overloaded``, before admission) while this process's loop runs
        late, as a frontend does (``frontend/shedding.py``): the controller sheds what it cannot plan in time."""
        self.service = service
        self.endpoint = endpoint
        self._secret = tcp_secret(endpoint, secret)
        self._context = zmq.asyncio.Context() if self._secret else zmq.asyncio.Context.instance()  # its own ZAP handler
        self._authenticator: AsyncioAuthenticator | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._batched: Batched | None = None  # the socket read and written without a future per message
        self._frontends: dict[bytes, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sent: object = None
        self._seq = 0  # of the last state sent
        self._applied: dict[bytes, int] = {}  # the last state each frontend said it answers from
        self._acked = asyncio.Event()
        self.gate = ArrivalGate(target_lag_ns(service.default_slo_ns), watching=shed)
        self.signal_models: frozenset[str] | None = None  # a cell's: None until the frontends say (then all)
        self._receive_part = service.ledger.part("receive")
        self._answer_part = service.ledger.part("answer")
        self._metrics_part = service.ledger.part("metrics")
        self._page_part = service.ledger.part("page")

    @property
    def joined(self) -> int:
        """Frontend processes that said they are there."""
        return len(self._frontends)

    async def start(self) -> None:
        socket = self._socket = self._context.socket(zmq.ROUTER)  # closed by ``close`` even if the bind fails
        socket.setsockopt(zmq.LINGER, 0)
        if self._secret:
            self._authenticator = secure_controller(self._context, socket, self._secret)
        try:
            socket.bind(self.endpoint)
        except zmq.ZMQError as error:
            raise OSError(f"cannot listen for frontends on {self.endpoint}: {error.strerror}") from None
        self.service.state_listeners.append(self._broadcast_if_changed)
        self._batched = Batched(socket, self._take)
        self._batched.start()
        self.gate.watch()

    async def close(self) -> None:
        if self._broadcast_if_changed in self.service.state_listeners:
            self.service.state_listeners.remove(self._broadcast_if_changed)
        self.gate.stop()
        if self._batched is not None:
            self._batched.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._socket is not None:
            self._socket.close(0)
        if self._authenticator is not None:
            self._authenticator.stop()
            self._context.term()  # its own (``start``)

    # --- state -----------------------------------------------------------------------------------
    def _state(self) -> State:
        service = self.service
        models = [ModelInfo(m.config, m.profile.to_json(), m.version) for _, m in sorted(service.models.items())]
        return State(models, service.device_count, service.accepting, dict(service.load_errors),
                     service.default_slo_ns, self._seq, service.in_line, service.pool_bytes)  # fmt: skip

    def _signature(self) -> object:
        service = self.service
        versions = tuple(sorted((name, m.version, m.key) for name, m in service.models.items()))  # key: reloads
        errors = tuple(sorted(service.load_errors.items()))
        return versions, service.device_count, service.accepting, errors, service.in_line

    async def _broadcast_if_changed(self, timeout_s: float = 2.0) -> None:
        """The service's listener: every frontend gets the state when it changed since last sent, and
        this returns once each has applied it, so the caller of a load or unload hears it is done only
        when every process answers accordingly (at most ``timeout_s``: a frontend that died is restarted
        and gets the state when it joins)."""
        signature = self._signature()
        if signature == self._sent or not self._frontends:
            return
        self._sent = signature
        self._seq += 1
        state, targets = self._state(), list(self._frontends)
        for identity in targets:
            self._send(identity, state)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while late := [i for i in targets if i in self._frontends and self._applied.get(i, 0) < state.seq]:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                log.warning("%s did not apply state %d within %.1f s", [self._frontends[i] for i in late], state.seq,
                            timeout_s)  # fmt: skip
                return
            self._acked.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked.wait(), left)

    # --- calls -----------------------------------------------------------------------------------
    def _take(self, message: list[zmq.Frame]) -> None:
        if self._batched is not None:  # while the loop runs late, fewer new calls a wake: results and passes first
            self._batched.most_per_wake = MOST_PER_WAKE if self.gate.share >= 1.0 else LATE_PER_WAKE
        with self._receive_part:
            self._dispatch(bytes(message[0].buffer), message[1:])

    def _dispatch(self, key: bytes, frames: list[zmq.Frame]) -> None:
        """Decode and act on one message."""
        try:
            # views, not copies: the controller only checks a call's inputs and passes them on to a worker
            message, samples = decode_frontend([frame.buffer for frame in frames], copy=False)
        except CodecError as error:
            log.warning("dropped a message from a frontend: %s", error)
            return
        if isinstance(message, Join):
            for stale in [k for k, name in self._frontends.items() if name == message.frontend]:
                del self._frontends[stale]  # that process is gone: this is the one started after it
                self._applied.pop(stale, None)
            self._frontends[key] = message.frontend
            log.info("frontend %s joined", message.frontend)
            self._send(key, self._state())
        elif isinstance(message, Applied):
            self._applied[key] = max(self._applied.get(key, 0), message.seq)
            self._acked.set()
        elif isinstance(message, Submit | Ask) and key not in self._frontends:
            # Sent to a process of this controller that died (it queued in the frontend's socket): that
            # frontend will not wait for it, and running it here would do the work twice.
            reason = "this controller was restarted since the call was sent; the frontend joins it again"
            self._send(key, Refused(message.call, RESTARTED, reason))
        elif isinstance(message, Submit) and samples is not None:
            self._infer(key, message, samples)
        elif isinstance(message, Ask):
            self._spawn(self._ask(key, message))
        elif isinstance(message, Dropped):
            for transport, cause, count in message.counts:
                if transport in ("http", "grpc") and cause in CAUSES and count > 0:  # a counter only goes up
                    self.service.count_dropped_client(transport, cause, self._frontends.get(key, "?"), count)

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _infer(self, identity: bytes, submit: Submit, samples: list[dict[str, Any]]) -> None:
        """Admit the call now; its answers go back when the last is made (no task per call: under load
        the loop's own work per task cost more than admitting)."""
        metrics = self.service.metrics
        with self._metrics_part:
            metrics.child(metrics.frontend_calls, self._frontends.get(identity, "?")).inc()

        def answer(answers: list[Answer]) -> None:
            with self._answer_part:
                outputs = [output if response.outcome is Outcome.SERVED else {} for response, output in answers]
                reply = Answers(submit.call, [r.outcome for r, _ in answers], [r.reason for r, _ in answers],
                                metas_of(outputs))  # fmt: skip
                self._send(identity, reply, outputs)

        if not self.gate.admit():  # cheaper refused now than planned late
            metrics.child(metrics.rejections, Outcome.OVERLOADED.value).inc(len(samples))
            self._send(identity, Refused(submit.call, "overloaded", self.gate.reason()))
            return
        try:  # the call's time in the frontend counts against its deadline
            self.service.submit(submit.model, samples, submit.slo_ns, submit.waited_ns, answer, submit.traceparent)
        except ServiceError as error:
            self._send(identity, Refused(submit.call, error.kind, str(error)))

    async def _ask(self, identity: bytes, ask: Ask) -> None:
        service = self.service
        try:
            value: Any = None
            if ask.what == "load":
                await service.load_model(ask.model)
            elif ask.what == "reload":
                await service.reload_model(ask.model)
            elif ask.what == "unload":
                await service.unload_model(ask.model)
            elif ask.what == "warm":
                value = await service.warm(ask.model)
            elif ask.what == "statistics":
                value = msgspec.to_builtins(await service.model_statistics(ask.model))
            elif ask.what == "metrics":
                value = await service.exposition()
            elif ask.what == "timeline":  # the live page's poll: made and sent apart (``dashboard_cost.py``)
                with self._page_part:
                    self._send(identity, Reply(ask.call, service.page_view(ask.seconds, ask.cursor)))
                return
            elif ask.what == "state":
                self._send(identity, self._state())
            elif ask.what == "signal_models":  # the cells' plan: what this cell's load signal is to carry
                self.signal_models = frozenset(ask.models)
            elif ask.what == "in_line":  # a cell: the server brought it in line with the others
                service.in_line = True
                await service.announce()
            else:
                raise ServiceError("invalid", f"unknown question {ask.what!r}")
        except ServiceError as error:
            self._send(identity, Refused(ask.call, error.kind, str(error)))
        except ModelLoadError as error:
            self._send(identity, Refused(ask.call, "invalid", str(error)))
        else:
            self._send(identity, Reply(ask.call, value))

    def _send(self, identity: bytes, message: msgspec.Struct, samples: list[Sample] | None = None) -> None:
        """Encode and queue the message now (a frontend whose queue is full loses it, as ZeroMQ's ROUTER
        does: that frontend is gone or stuck, and its calls end with its own timeouts)."""
        if self._batched is not None:
            with contextlib.suppress(zmq.Again, zmq.ZMQError):  # gone meanwhile: nothing to send it to
                self._batched.send([identity, *encode(message, samples)])
