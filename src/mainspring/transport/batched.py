"""A ZeroMQ socket on the asyncio loop without a future per message.

pyzmq's asyncio socket makes a future, and callbacks on the event loop, for every send and every
receive; under load that glue cost the controller more than decoding the messages. ``Batched`` reads
the socket when the loop says its descriptor is readable and takes every message already queued (up
to a bound a wake-up, so one busy socket cannot hold the loop); a send is a plain non-blocking send.

ZeroMQ's descriptor is edge-triggered and any operation on the socket may consume the edge, so after
each send and each batch the socket's events are looked at again, and a batch is scheduled when
messages are waiting (the rule in ``zmq_getsockopt(ZMQ_FD)``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import zmq

log = logging.getLogger(__name__)

MOST_PER_WAKE = 256  # messages taken per wake-up before the loop gets to its other work


class Batched:
    """``socket`` (any ZeroMQ socket; an asyncio one is used through a plain view of it) read on the
    running loop: ``handle`` gets each message's frames, in order."""

    def __init__(self, socket: zmq.Socket[Any], handle: Callable[[list[Any]], None], copy: bool = False) -> None:
        self.socket: zmq.Socket[Any] = zmq.Socket.shadow(socket.underlying)
        self.most_per_wake = MOST_PER_WAKE  # its owner may take fewer while its loop runs late
        self._handle = handle
        self._copy = copy
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.socket.FD, self._readable)
        self._schedule()  # messages may have come before the reader was there

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.socket.FD)
            self._loop = None

    def send(self, frames: Sequence[Any]) -> None:
        """Queue ``frames`` as one message now: ``zmq.Again`` when the peer's queue is full (a ROUTER with
        ``ROUTER_MANDATORY``), ``zmq.ZMQError`` when the peer is gone."""
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        finally:
            self._check()

    def _readable(self) -> None:
        self._scheduled = False
        socket = self.socket
        for _ in range(self.most_per_wake):
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK, copy=self._copy)
            except zmq.Again:
                break
            except zmq.ZMQError:  # closed meanwhile
                return
            try:
                self._handle(frames)
            except Exception:  # a bug in one message's handling must not leave the others unread
                log.exception("could not handle a message")
            if self._loop is None:
                return  # stopped by the handler
        self._check()

    def _check(self) -> None:
        """Schedule a batch when messages wait that the descriptor's edge may no longer announce."""
        if self._loop is None or self._scheduled:
            return
        try:
            waiting = bool(int(self.socket.get(zmq.EVENTS)) & zmq.POLLIN)
        except zmq.ZMQError:  # closed
            return
        if waiting:
            self._schedule()

    def _schedule(self) -> None:
        if self._loop is not None and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._readable)
