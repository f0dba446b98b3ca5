"""Clients that take too long or come too many: cut off with an answer that names the setting, counted
in the metrics, logged in a line, and never in the way of the other clients. A real HTTP server on
loopback in front of the live controller service with an emulated worker; raw sockets as clients."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mainspring.controller.service import ControllerService
from mainspring.frontend.connections import DroppedClients
from mainspring.frontend.dataplane import DataPlane
from mainspring.frontend.grpc import start_grpc
from mainspring.frontend.http import start_http
from mainspring.frontend.limits import RequestLimits
from mainspring.worker.inprocess import InProcessWorker
from tests.controller.test_service import with_service
from tests.serving.processes import free_ports
from tests.waiting import until

BODY = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}).encode()
INFER = b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
PATIENCE_S = 60.0  # how long a client waits for what must come; only a broken server waits that long


def with_frontends(test: Callable[[ControllerService, int, int], Awaitable[None]], **limits: Any) -> None:
    """``test(service, http_port, grpc_port)`` with HTTP and gRPC frontends on free loopback ports, their
    limits ``limits``, before the live service with an emulated worker serving echo models ``a`` and ``b``."""

    async def serve(service: ControllerService, _: DataPlane, __: InProcessWorker) -> None:
        await on_frontends(service, DataPlane(service, limits=RequestLimits(**limits)), test)

    with_service(serve)


async def on_frontends(
    service: ControllerService, plane: DataPlane, test: Callable[[ControllerService, int, int], Awaitable[None]]
) -> None:
    """``test(service, http_port, grpc_port)`` with ``plane``'s HTTP and gRPC frontends on free loopback ports."""
    http_port, grpc_port = free_ports(2)
    runner = await start_http(plane, "127.0.0.1", http_port)
    grpc_server = await start_grpc(plane, f"127.0.0.1:{grpc_port}")
    try:
        await test(service, http_port, grpc_port)
    finally:
        await grpc_server.stop(0.5)
        await runner.cleanup()


def with_http(test: Callable[[ControllerService, int], Awaitable[None]], **limits: Any) -> None:
    async def http_only(service: ControllerService, http_port: int, _: int) -> None:
        await test(service, http_port)

    with_frontends(http_only, **limits)


def connect(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S)
    client.settimeout(PATIENCE_S)
    return client


def read_to_end(client: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    chunks = []
    try:
        while chunk := client.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def request(port: int, body: bytes = BODY) -> tuple[int, bytes]:
    """One whole request on a connection of its own: the status and the body."""
    with connect(port) as client:
        client.sendall(INFER + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        answer = read_to_end(client)
    head, _, rest = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


def trickle(client: socket.socket, data: bytes, stop: threading.Event, every_s: float = 0.1) -> None:
    """Send ``data`` a byte every ``every_s`` until it is all sent, the server closes, or ``stop``."""
    for byte in data:
        if stop.wait(every_s):
            return
        try:
            client.send(bytes([byte]))
        except OSError:  # closed by the server
            return


def disconnects(service: ControllerService) -> dict[str, float]:
    """mainspring_client_disconnects_total by cause (every frontend and transport together)."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(service.metrics.exposition(0).decode()):
        for sample in family.samples:
            if sample.name == "mainspring_client_disconnects_total":
                counts[sample.labels["cause"]] = counts.get(sample.labels["cause"], 0) + sample.value
    return counts


def slowly(port: int, first: bytes, rest: bytes) -> tuple[bytes, float]:
    """Send ``first``, then ``rest`` a byte every 100 ms: what the server answers, and after how long it closed."""
    stop = threading.Event()
    with connect(port) as client:
        started = time.monotonic()
        client.sendall(first)
        sender = threading.Thread(target=trickle, args=(client, rest, stop))
        sender.start()
        answer = read_to_end(client)
        closed_s = time.monotonic() - started
        stop.set()
        sender.join()
    return answer, closed_s


def test_slow_headers_and_a_slow_body_are_cut_off_while_other_clients_are_served() -> None:
    async def test(service: ControllerService, port: int) -> None:
        slow = [asyncio.to_thread(slowly, port, b"", INFER + b"X-Slow: " + b"a" * 1000) for _ in range(2)]
        slow.append(asyncio.to_thread(slowly, port, INFER + b"Content-Length: 1000\r\n\r\n{", b" " * 999))
        cut_off = asyncio.gather(*slow)
        served = [await asyncio.to_thread(request, port) for _ in range(20)]  # meanwhile
        (headers_answer, headers_s), _, (body_answer, body_s) = await cut_off
        assert all(status == 200 for status, _ in served), served
        assert headers_answer.startswith(b"HTTP/1.1 408") and b"header_timeout_s" in headers_answer, headers_answer
        assert body_answer.startswith(b"HTTP/1.1 408") and b"body_timeout_s" in body_answer, body_answer
        # Closed by their timeouts (1 s, 1.5 s), while the bytes kept coming: not by the idle timeout (30 s),
        # nor read on at the client's pace for aiohttp's lingering close (10 s).
        assert headers_s < 1 + 8 and body_s < 1.5 + 8, (headers_s, body_s)
        assert disconnects(service) == {"header_timeout": 2, "body_timeout": 1}
        assert (await asyncio.to_thread(request, port))[0] == 200

    with_http(test, header_timeout_s=1.0, body_timeout_s=1.5, idle_timeout_s=30.0)


def test_idle_connections_are_closed_after_the_idle_timeout() -> None:
    async def test(service: ControllerService, port: int) -> None:
        def kept_alive() -> tuple[int, bytes]:
            with connect(port) as client:  # one request, then nothing
                client.sendall(INFER + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
                answer = read_to_end(client)
            return int(answer.split()[1]), answer

        def silent() -> bytes:
            with connect(port) as client:  # connected, never a byte
                return read_to_end(client)

        (status, answer), nothing = await asyncio.gather(asyncio.to_thread(kept_alive), asyncio.to_thread(silent))
        assert status == 200 and answer.count(b"HTTP/1.1") == 1, answer  # answered once, then closed
        assert nothing == b""
        assert disconnects(service) == {}  # an idle connection closed is no client's fault

    with_http(test, idle_timeout_s=1.0)


def test_connections_past_the_limit_are_refused_with_a_503_naming_it() -> None:
    async def test(service: ControllerService, port: int) -> None:
        def served(client: socket.socket) -> bytes:
            client.sendall(INFER + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
            return client.recv(65536)

        held = [await asyncio.to_thread(connect, port) for _ in range(3)]
        try:
            for client in held:  # each is open and served (so the server has counted it)
                assert (await asyncio.to_thread(served, client)).startswith(b"HTTP/1.1 200")
            status, body = await asyncio.to_thread(request, port)
            assert status == 503 and "max_connections" in json.loads(body)["error"], body
        finally:
            for client in held:
                client.close()
        assert disconnects(service) == {"connection_limit": 1}

        async def served_again() -> bool:
            return (await asyncio.to_thread(request, port))[0] == 200

        await until(served_again)  # the closed ones no longer count

    with_http(test, max_connections=3)


def test_clients_that_hang_up_mid_body_are_counted_and_logged_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    async def test(service: ControllerService, port: int) -> None:
        def hang_up() -> None:
            with connect(port) as client:
                client.sendall(INFER + b"Content-Length: 100000\r\n\r\n" + b" " * 100)

        with caplog.at_level(logging.INFO):
            for _ in range(5):
                await asyncio.gather(*(asyncio.to_thread(hang_up) for _ in range(20)))

            await until(lambda: disconnects(service).get("hung_up", 0) == 100)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        lines = [r.getMessage() for r in caplog.records if "hung up mid-request" in r.getMessage()]
        # one line, and one more 10 s later with the rest (if the test ran that long)
        assert 1 <= len(lines) <= 2 and not any("\n" in line for line in lines), caplog.text

    with_http(test)


def test_dropped_clients_are_logged_at_most_once_per_interval_with_what_came_between() -> None:
    counted: list[tuple[str, str]] = []
    now = [100.0]
    dropped = DroppedClients(lambda transport, cause: counted.append((transport, cause)), clock=lambda: now[0])
    logger = logging.getLogger("mainspring.frontend.connections")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        dropped.record("http", "hung_up")
        for _ in range(50):
            dropped.record("http", "header_timeout")
        now[0] += 10.0
        dropped.record("grpc", "hung_up")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert len(counted) == 52
    assert len(lines) == 2, lines
    assert lines[0].startswith("1 http client(s) hung up mid-request")
    assert "1 grpc client(s) hung up" in lines[1] and "50 http client(s) sent no complete headers" in lines[1]


def test_a_connection_that_never_sends_a_byte_is_cut_off_by_the_header_timeout() -> None:
    async def test(service: ControllerService, port: int) -> None:
        answer, closed_s = await asyncio.to_thread(slowly, port, b"", b"")
        assert answer.startswith(b"HTTP/1.1 408") and closed_s < 1 + 8, (answer, closed_s)
        assert disconnects(service) == {"header_timeout": 1}

    with_http(test, header_timeout_s=1.0, idle_timeout_s=30.0)


def test_the_rest_of_a_refused_body_is_not_taken_for_slow_headers() -> None:
    """Answered 413 before its body was read, aiohttp reads the rest for a while: those bytes arriving slowly
    must not start the header timeout (a second answer, a 408, on the same connection)."""

    async def test(service: ControllerService, port: int) -> None:
        first = INFER + b"Content-Length: 6000\r\n\r\n" + b" " * 2000
        answer, _ = await asyncio.to_thread(slowly, port, first, b" " * 40)  # 4 s of trickle after the 413
        assert answer.startswith(b"HTTP/1.1 413") and answer.count(b"HTTP/1.1") == 1, answer
        assert "header_timeout" not in disconnects(service)

    with_http(test, header_timeout_s=1.0, max_body_bytes=1024)


def test_what_comes_within_the_interval_is_logged_at_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    from mainspring.frontend import connections

    monkeypatch.setattr(connections, "LOG_EVERY_S", 0.05)
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("mainspring.frontend.connections")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)

    async def flood() -> None:
        dropped = DroppedClients(lambda transport, cause: None)
        for _ in range(4):
            dropped.record("http", "hung_up")
        await asyncio.sleep(0.5)  # no more clients come: the three after the first are logged all the same

    try:
        asyncio.run(flood())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert [line.split(" (")[0] for line in lines] == ["1 http client(s) hung up mid-request",
                                                       "3 http client(s) hung up mid-request"]  # fmt: skip


def test_grpc_closes_a_connection_that_never_speaks_http2() -> None:
    async def test(service: ControllerService, _: int, grpc_port: int) -> None:
        def silent() -> float:
            with connect(grpc_port) as client:
                started = time.monotonic()
                read_to_end(client)
                return time.monotonic() - started

        closed_s = await asyncio.to_thread(silent)
        assert closed_s < 1 + 8, closed_s  # the handshake timeout (header_timeout_s), not the idle one (30 s)

    with_frontends(test, header_timeout_s=1.0, idle_timeout_s=30.0)


def test_grpc_asks_an_idle_connection_to_go_away() -> None:
    async def test(service: ControllerService, _: int, grpc_port: int) -> None:
        def idle_goaway() -> bool:
            import grpc
            from tritonclient.grpc import service_pb2 as pb
            from tritonclient.grpc import service_pb2_grpc as pb_grpc

            states: list[grpc.ChannelConnectivity] = []
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                pb_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=60)
                channel.subscribe(states.append)
                deadline = time.monotonic() + PATIENCE_S
                while grpc.ChannelConnectivity.IDLE not in states and time.monotonic() < deadline:
                    time.sleep(0.05)  # the server's GOAWAY after max_connection_idle turns the channel idle
            return grpc.ChannelConnectivity.IDLE in states

        assert await asyncio.to_thread(idle_goaway)

    with_frontends(test, idle_timeout_s=1.0)
