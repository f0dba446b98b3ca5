"""Each cell's load signal over ZeroMQ: a cell's controller publishes it every few milliseconds on a
PUB socket; every frontend subscribes to all cells and keeps the newest (``routing.Router``).

Times are ``time.monotonic_ns``, one clock for every process of the machine (cells and frontends of
one ``serve`` share it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio

from mainspring.cells.routing import CellSignal

log = logging.getLogger(__name__)

SIGNAL_PERIOD_S = 0.005


class SignalMessage(msgspec.Struct, frozen=True, array_like=True):
    cell: int
    at_ns: int
    devices: int
    finish_ns: dict[str, int]
    cold_start_ns: int

    def signal(self) -> CellSignal:
        return CellSignal(self.cell, self.at_ns, self.devices, self.finish_ns, self.cold_start_ns)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SignalMessage)


class SignalPublisher:
    """Publishes ``compute()`` on ``endpoint`` every ``period_s`` until closed."""

    def __init__(self, endpoint: str, compute: Callable[[], CellSignal], period_s: float = SIGNAL_PERIOD_S) -> None:
        self.endpoint = endpoint
        self._compute = compute
        self._period_s = period_s
        self._socket: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self.published = 0

    def start(self) -> None:
        socket = zmq.asyncio.Context.instance().socket(zmq.PUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 16)  # a subscriber that does not read loses old signals, not memory
        socket.bind(self.endpoint)
        self._socket = socket
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        assert self._socket is not None
        while True:
            signal = self._compute()
            message = SignalMessage(signal.cell, signal.at_ns, signal.devices, dict(signal.finish_ns),
                                    signal.cold_start_ns)  # fmt: skip
            with contextlib.suppress(zmq.Again):
                await self._socket.send(_encoder.encode(message), zmq.NOBLOCK)
            self.published += 1
            await asyncio.sleep(self._period_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._socket is not None:
            self._socket.close(0)


class SignalSubscriber:
    """Hands every signal from ``endpoints`` to ``deliver`` (a router's ``publish``)."""

    def __init__(self, endpoints: list[str], deliver: Callable[[CellSignal], None]) -> None:
        self._endpoints = endpoints
        self._deliver = deliver
        self._socket: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        for endpoint in self._endpoints:
            socket.connect(endpoint)
        self._socket = socket
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        assert self._socket is not None
        while True:
            data = await self._socket.recv()
            try:
                message = _decoder.decode(data)
            except msgspec.DecodeError as error:
                log.warning("dropped a load signal that does not decode: %s", error)
                continue
            self._deliver(message.signal())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._socket is not None:
            self._socket.close(0)
