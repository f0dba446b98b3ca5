"""How many HTTP clients may be connected, and how long each may take to send a request.

aiohttp bounds the length of a header line and, with its keep-alive timer, how long a connection
waits for a request, but not how long one request's headers may take once they have begun, nor
how many connections are open. A client that sends a byte every 100 ms, or opens connections and
says nothing, would hold a file descriptor each for as long as it liked. ``WatchedSite`` listens
in front of aiohttp's handler: past ``max_connections`` a new connection is answered 503 and
closed; a request whose headers are not all in within ``header_timeout_s`` of its first byte (of
the connection's opening, for its first request) is answered 408 and closed. The body's bound
(``body_timeout_s``) is the handler's (``http.py``); the idle bound between requests is aiohttp's
keep-alive timer, set to ``idle_timeout_s``. After an answer given before its body was read (a
401, a 413), aiohttp reads the rest for up to 10 s (its lingering close): no header timer runs
then, or the body's bytes would start one.

Clients that are cut off, and those that hang up mid-request, are counted by cause
(``mainspring_client_disconnects_total``) and logged one line at a time at most every
``LOG_EVERY_S``: a flood of them must not flood the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import time
from collections import Counter
from collections.abc import Callable

from aiohttp import web

from mainspring.frontend.limits import RequestLimits
from mainspring.transport.frontend_messages import CAUSES

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0


class DroppedClients:
    """Counts clients gone mid-request or cut off (``count(transport, cause)``: the metric), and logs
    them in one line at most every ``LOG_EVERY_S`` seconds: what comes within one is logged at its end."""

    def __init__(self, count: Callable[[str, str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._count = count
        self._clock = clock
        self._unlogged: Counter[tuple[str, str]] = Counter()
        self._logged_at = -LOG_EVERY_S
        self._report_due: asyncio.TimerHandle | None = None

    def record(self, transport: str, cause: str) -> None:
        self._count(transport, cause)
        self._unlogged[transport, cause] += 1
        wait_s = self._logged_at + LOG_EVERY_S - self._clock()
        if wait_s <= 0:
            self.report()
        elif self._report_due is None:
            with contextlib.suppress(RuntimeError):  # no event loop (a caller of its own): the next record reports
                self._report_due = asyncio.get_running_loop().call_later(wait_s, self.report)

    def report(self) -> None:
        """Log what has not been logged, in one line."""
        if self._report_due is not None:
            self._report_due.cancel()
            self._report_due = None
        if not self._unlogged:
            return
        counts = sorted(self._unlogged.items())
        summary = "; ".join(f"{n} {where} client(s) {CAUSES[why]}" for (where, why), n in counts)
        log.info("%s (since the last such line; mainspring_client_disconnects_total counts them)", summary)
        self._unlogged.clear()
        self._logged_at = self._clock()


def _answer_and_close(transport: asyncio.BaseTransport, status: int, reason: str, message: str) -> None:
    """Write a whole HTTP response that ends the connection, then close it (what was received is dropped)."""
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
    if isinstance(transport, asyncio.WriteTransport) and not transport.is_closing():
        transport.write(head.encode() + body)
    transport.close()


class _Watched(asyncio.Protocol):
    """One connection: aiohttp's handler behind it, timed while a request's headers arrive."""

    def __init__(self, handler: asyncio.Protocol, connections: ConnectionWatch) -> None:
        self._handler = handler
        self._connections = connections
        self._transport: asyncio.BaseTransport | None = None
        self._refused = False
        self._between_requests = True  # no request is being handled: the next byte starts one
        self._answered_for_good = False  # what the client sends now is the rest of a body refused for being slow
        self._headers_due: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        connections = self._connections
        if len(connections.open) >= connections.limits.max_connections:
            self._refused = True
            connections.dropped.record("http", "connection_limit")
            message = f"too many connections: {connections.limits.max_connections} are open (max_connections)"
            _answer_and_close(transport, 503, "Service Unavailable", message)
            return
        connections.open[transport] = self
        self._handler.connection_made(transport)
        self._start_timer()  # a client that connects and never sends a byte is held no longer

    def data_received(self, data: bytes) -> None:
        if self._refused or self._answered_for_good:  # refused, or the rest of a body refused for being slow
            return
        if self._between_requests:
            self._start_timer()
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self._refused else self._handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._transport is not None:
            self._connections.open.pop(self._transport, None)
        if not self._refused:
            self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self._refused:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if not self._refused:
            self._handler.resume_writing()

    def request_started(self) -> None:
        self._stop_timer()
        self._between_requests = False

    def request_finished(self, body_read: bool) -> None:
        """The handler answered; ``body_read``: all of the request's body was read (else aiohttp reads the rest
        for up to 10 s, and those bytes are not a next request's headers)."""
        self._between_requests = body_read
        if self._answered_for_good and self._transport is not None:
            # Soon: once aiohttp has written the answer (it does without yielding), not after its lingering
            # close, which would read on for 10 s at the client's pace. close() sends what is written first.
            asyncio.get_running_loop().call_soon(self._transport.close)

    def close_after_answer(self) -> None:
        """The request was refused for a body too slow: close once the answer is out, reading no more of it."""
        self._answered_for_good = True

    def _start_timer(self) -> None:
        if self._headers_due is None:
            timeout = self._connections.limits.header_timeout_s
            self._headers_due = asyncio.get_running_loop().call_later(timeout, self._headers_late)

    def _stop_timer(self) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def _headers_late(self) -> None:
        self._headers_due = None
        if self._transport is None or self._transport.is_closing():
            return
        self._connections.dropped.record("http", "header_timeout")
        timeout = self._connections.limits.header_timeout_s
        message = f"request headers not received within {timeout:g} s (header_timeout_s)"
        _answer_and_close(self._transport, 408, "Request Timeout", message)


class ConnectionWatch:
    """The open connections of one HTTP frontend, with their limits and where cut-offs are counted."""

    def __init__(self, limits: RequestLimits, dropped: DroppedClients) -> None:
        self.limits = limits
        self.dropped = dropped
        self.open: dict[asyncio.BaseTransport, _Watched] = {}

    def watch(self, handler: asyncio.Protocol) -> asyncio.Protocol:
        return _Watched(handler, self)

    def connection(self, transport: asyncio.BaseTransport | None) -> _Watched | None:
        """The watched connection a request came on (None: a site that does not watch)."""
        return None if transport is None else self.open.get(transport)


def ensure_descriptors(connections: int, headroom: int = 256) -> None:
    """Raise this process's soft limit on open files to fit ``connections`` and ``headroom`` (workers' sockets,
    gRPC's, files), up to the hard limit; warn if that is not enough: past the limit asyncio stops accepting."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + headroom
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        if soft < wanted:
            log.warning("max_connections=%d and %d more open files need %d descriptors; this process may open %d "
                        "(ulimit -n): lower max_connections or raise the limit",
                        connections, headroom, wanted, soft)  # fmt: skip


class WatchedSite(web.TCPSite):
    """aiohttp's TCP site with every connection watched by ``connections``."""

    def __init__(self, runner: web.AppRunner, connections: ConnectionWatch, host: str, port: int,
                 reuse_port: bool | None = None) -> None:  # fmt: skip
        super().__init__(runner, host, port, reuse_port=reuse_port)
        self._connections = connections

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        connections = self._connections
        self._server = await asyncio.get_running_loop().create_server(
            lambda: connections.watch(server()), self._host, self._port, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port,
        )  # fmt: skip
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port
