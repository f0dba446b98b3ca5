"""Each cell's load signal over ZeroMQ: a cell's controller publishes it every few milliseconds on a
PUB socket; every frontend subscribes to all cells and keeps the newest (``routing.Router``).

Times are each cell's ``time.monotonic_ns``; a subscriber moves them onto its own clock as they
arrive (a cell on another machine, on Ray, has another clock), taking the signal as computed then:
the transit, well under the 0.5 ms quantum on one machine or a LAN, is not counted. On TCP, with the
worker secret, the signal is CURVE-encrypted and subscribers check the publisher's key.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio

from mainspring.cells.routing import CellSignal
from mainspring.transport.security import secure_publisher, secure_worker, tcp_secret

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.1  # an unchanged signal is sent again this often: the frontends' sign that the cell lives
QUANTUM_NS = 500_000  # finish times closer than this to the last ones sent count as unchanged


class SignalMessage(msgspec.Struct, frozen=True, array_like=True):
    cell: int
    at_ns: int
    devices: int
    finish_ns: dict[str, int]
    cold_start_ns: int
    incarnation: int = 0

    def signal(self) -> CellSignal:
        return CellSignal(self.cell, self.at_ns, self.devices, self.finish_ns, self.cold_start_ns, self.incarnation)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SignalMessage)


class SignalPublisher:
    """Publishes ``compute()`` on ``endpoint`` at every ``tick`` (the controller's 5 ms timer) when it
    changed, and every ``HEARTBEAT_S`` anyway. Sends never wait: a subscriber that does not read loses
    old signals, not memory."""

    def __init__(self, endpoint: str, compute: Callable[[], CellSignal], secret: str = "") -> None:
        self.endpoint = endpoint
        self._secret = tcp_secret(endpoint, secret)
        self._compute = compute
        self._socket: zmq.Socket[bytes] | None = None
        self._last_shape: object = None
        self._last_sent_ns = 0

    def start(self) -> None:
        socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 16)
        if self._secret:
            secure_publisher(socket, self._secret)
        try:
            socket.bind(self.endpoint)
        except zmq.ZMQError as error:
            socket.close(0)
            raise OSError(f"cannot publish the load signal on {self.endpoint}: {error.strerror}") from None
        self._socket = socket

    def tick(self) -> None:
        """A signal whose times, relative to its own moment, moved less than ``QUANTUM_NS`` since the
        last one sent is not sent (a router reads a time past as now), except every ``HEARTBEAT_S``."""
        if self._socket is None:
            return
        signal = self._compute()
        shape = _shape(signal)
        if shape == self._last_shape and signal.at_ns - self._last_sent_ns < HEARTBEAT_S * 1e9:
            return
        message = SignalMessage(signal.cell, signal.at_ns, signal.devices, dict(signal.finish_ns),
                                signal.cold_start_ns, signal.incarnation)  # fmt: skip
        with contextlib.suppress(zmq.Again):
            self._socket.send(_encoder.encode(message), zmq.NOBLOCK)
        self._last_shape, self._last_sent_ns = shape, signal.at_ns

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(0)
            self._socket = None


def _shape(signal: CellSignal) -> object:
    """The signal's times relative to its moment, in quanta (what routing would see differently)."""
    at = signal.at_ns
    finish = tuple(sorted((m, (t - at) // QUANTUM_NS) for m, t in signal.finish_ns.items()))
    return signal.devices, finish, max(signal.cold_start_ns - at, 0) // QUANTUM_NS


class SignalSubscriber:
    """Hands every signal from ``endpoints`` to ``deliver`` (a router's ``publish``)."""

    def __init__(self, endpoints: list[str], deliver: Callable[[CellSignal], None], secret: str = "") -> None:
        self._endpoints = endpoints
        self._secret = secret  # the cells' signals are TCP ports (Ray): their publishers hold it
        self._deliver = deliver
        self._socket: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        if self._secret:
            secure_worker(socket, self._secret)
        for endpoint in self._endpoints:
            socket.connect(endpoint)
        self._socket = socket
        self._task = asyncio.create_task(self._run())

    def add(self, endpoint: str) -> None:
        """Signals from one more cell (cells on Ray: a node joined)."""
        self._endpoints.append(endpoint)
        if self._socket is not None:
            self._socket.connect(endpoint)

    async def _run(self) -> None:
        assert self._socket is not None
        while True:
            data = await self._socket.recv()
            try:
                message = _decoder.decode(data)
            except msgspec.DecodeError as error:
                log.warning("dropped a load signal that does not decode: %s", error)
                continue
            self._deliver(on_this_clock(message.signal(), time.monotonic_ns()))

    async def close(self) -> None:
        await _stop(self._task, self._socket)


def on_this_clock(signal: CellSignal, received_ns: int) -> CellSignal:
    """``signal``'s times moved so that it was computed at ``received_ns`` on this process's clock."""
    shift = received_ns - signal.at_ns
    finish = {model: end + shift for model, end in signal.finish_ns.items()}
    return dataclasses.replace(signal, at_ns=received_ns, finish_ns=finish, cold_start_ns=signal.cold_start_ns + shift)


async def _stop(task: asyncio.Task[None] | None, socket: zmq.asyncio.Socket | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if socket is not None:
        socket.close(0)
