"""A frontend process of its own (``serve --frontends N``): HTTP and gRPC on the server's ports
(``SO_REUSEPORT``: the kernel spreads connections over the processes), the controller behind a local
ZeroMQ channel (``RemoteController``), or the cells' controllers behind ``CellsPort`` with
``serve --cells N``. The process exits when the server's process is gone; ``serve`` starts a frontend
that exits again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from typing import Any

import msgspec

from mainspring.frontend.cells_port import CellsPort
from mainspring.frontend.remote import RemoteController
from mainspring.transport.security import SECRET_ENV

log = logging.getLogger("mainspring.frontend.process")  # also when run as __main__


class FrontendSpec(msgspec.Struct, frozen=True):
    """What ``serve`` tells a frontend process (as JSON on its command line; the token in the environment)."""

    endpoint: str
    name: str
    host: str
    http_port: int
    grpc_port: int
    parent_pid: int
    repo: str = ""
    limits: dict[str, Any] = {}  # RequestLimits' fields
    auth_inference: bool = False
    cells: list[str] = []  # serve --cells N: each cell's controller; ``endpoint`` is then unused
    signals: list[str] = []  # and each cell's load signal
    cells_file: str = ""  # cells on Ray: the cells added since, listed by the server (CellsPort follows it)
    shared_memory: str = ""  # the folder of the server's shared-memory registrations (``SharedMemoryRegions``)
    shed: bool = True  # shed at arrival while this process's loop runs late (``shed_at_arrival``)
    otlp_endpoint: str = ""  # traces to this OTLP/HTTP collector ("": none)
    trace_sample_ratio: float = 1.0


TOKEN_ENV = "MAINSPRING_AUTH_TOKEN"


async def run_frontend(spec: FrontendSpec) -> None:
    """Serve HTTP and gRPC on the shared ports until SIGINT/SIGTERM or the controller's process ends."""
    from mainspring.frontend.access import Access
    from mainspring.frontend.dataplane import DataPlane
    from mainspring.frontend.grpc import start_grpc
    from mainspring.frontend.http import start_http
    from mainspring.frontend.limits import RequestLimits
    from mainspring.frontend.shared_memory import SharedMemoryRegions
    from mainspring.models.repository import ModelRepository

    controller: CellsPort | RemoteController  # each a ControllerPort (mypy checks it at DataPlane)
    if spec.cells or spec.cells_file:
        secret = os.environ.get(SECRET_ENV, "")  # cells on Ray: their channels are TCP ports it guards
        controller = CellsPort(spec.name, spec.cells, spec.signals, secret=secret, cells_file=spec.cells_file)
    else:
        controller = RemoteController(spec.endpoint, spec.name)
    await controller.start()
    repo = ModelRepository(spec.repo) if spec.repo else None
    access = Access(os.environ.get(TOKEN_ENV, ""), spec.auth_inference)
    regions = SharedMemoryRegions(spec.shared_memory or None)
    tracing = None
    if spec.otlp_endpoint:
        from mainspring.telemetry.tracing import Tracing

        tracing = Tracing(spec.otlp_endpoint, spec.trace_sample_ratio, spec.name)
    plane = DataPlane(controller, repo, limits=RequestLimits(**spec.limits), access=access, shared_memory=regions,
                      shed=spec.shed, tracing=tracing)  # fmt: skip
    runner = await start_http(plane, spec.host, spec.http_port, reuse_port=True)
    grpc_server = await start_grpc(plane, f"{spec.host}:{spec.grpc_port}", share_port=True)
    log.info("frontend %s (pid %d) serving HTTP on %s:%d and gRPC on %s:%d", spec.name, os.getpid(),
             spec.host, spec.http_port, spec.host, spec.grpc_port)  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set() and os.getppid() == spec.parent_pid:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    await grpc_server.stop(grace=1.0)
    await runner.cleanup()
    plane.dropped.report()  # what the last interval saw, not left unlogged
    regions.close()
    plane.gate.stop()
    await controller.close()
    if tracing is not None:
        tracing.close()  # the spans still batched go out


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    spec = msgspec.json.decode(argv[0], type=FrontendSpec)
    try:
        asyncio.run(run_frontend(spec))
    except (OSError, TimeoutError) as error:
        log.error("frontend %s: %r", spec.name, error)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
