"""``mainspring serve``: the roles of a serving process, composed into one ``Server``.

- ``controller_node.py``: the controller, the hub its workers join, local worker processes or workers
  on Ray, the repository poller;
- ``frontends.py``: HTTP and gRPC, and the frontend processes that share their ports;
- ``cell.py``: one cell of several (``local_cells.py``, ``ray_cells.py``): the frontends' channel to
  its controller and its load signal;
- ``supervision.py``: the child processes kept running.

SIGINT/SIGTERM: stop accepting, answer what is outstanding (up to ``drain_s``), say bye to the
workers, wait for the local ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from mainspring.controller.service import ControllerService
from mainspring.serving.cell import Cell, CellRole
from mainspring.serving.config import ServeConfig
from mainspring.serving.controller_node import ControllerNode
from mainspring.serving.frontends import CellsFront, Frontends
from mainspring.serving.supervision import Supervisor

if TYPE_CHECKING:
    from mainspring.telemetry.tracing import Tracing

log = logging.getLogger("mainspring.serve")


class Server:
    """The roles one ``serve`` process plays, composed: a controller node (its own workers, or in front
    of ``cells`` that plan, none), the frontends (unless it is one ``cell`` of several), and a
    supervisor of the child processes it keeps running."""

    def __init__(self, config: ServeConfig, cell: CellRole | None = None, cells: CellsFront | None = None) -> None:
        self.config = config
        self._stop = asyncio.Event()
        self.tracing = _tracing(config, f"cell-{cell.index}" if cell else "serve")  # who sent a span
        self.node = ControllerNode(config, cell.index if cell else None, plans=cells is None, tracing=self.tracing)
        self.cells = cells  # this server's frontends serve several cells
        self.cell = (
            Cell(cell, self.node.service, config.worker_secret, config.shed_at_arrival) if cell else None
        )  # one cell of several
        self.front = Frontends(config, self.node.service, cells, self.tracing) if cell is None else None
        self.supervisor = Supervisor(config.max_restarts_per_minute, self._stop)
        self.supervisor.flocks.append(self.node.flock())
        if self.front is not None:
            self.supervisor.flocks.append(self.front.flock())
        self._ready = False

    @property
    def service(self) -> ControllerService:
        return self.node.service

    async def start(self) -> None:
        config, node = self.config, self.node
        if config.workers == "local" and not config.ray and self.cells is None:
            node.check_devices()
        await node.open_repository()
        if self.cells is not None:
            await self.cells.start()
        else:
            await node.hub.start()
        if self.cell is not None:
            await self.cell.start()
        if self.front is not None:
            await self.front.start(node.repo, self._workers_at())
        if self.cells is None:  # the cells start their own workers and poll their own repositories
            await node.start_workers()
        self.supervisor.start()
        if self.cells is None:
            node.start_polling()
        self._ready = not self._stop.is_set()  # else a stop came while the workers loaded

    def _workers_at(self) -> str:
        """Where the workers connect, for the log."""
        config = self.config
        if self.cells is None:
            return self.node.hub.endpoint
        if config.workers == "local" and not (config.ray or config.worker_secret or config.allow_open_workers):
            return "their cell's private socket (ipc://, logged by each cell)"
        if config.ray:
            return "their cells, placed by Ray"
        return f"ports {config.worker_port}-{config.worker_port + config.cells - 1} (one per cell)"

    def request_stop(self) -> None:
        self._stop.set()

    async def serve_until_stopped(self, gone: Callable[[], bool] | None = None) -> None:
        """Serve until SIGINT or SIGTERM, or until ``gone()`` says the process that started this one is gone."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        if gone is not None:
            watch = asyncio.create_task(self._stop_when(gone))
            watch.add_done_callback(lambda _: None)
        try:
            await self._start_unless_stopped()
        except BaseException:
            await self.stop()  # what started goes down in order (the gRPC server must not outlive the loop)
            raise
        await self._stop.wait()
        await self.stop()

    async def _start_unless_stopped(self) -> None:
        """``start``, given up as soon as a stop is asked (SIGTERM while the cells or workers are awaited
        must not wait out ``join_timeout_s``); ``stop`` then ends what had started."""
        starting = asyncio.ensure_future(self.start())
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not starting.done():
                log.info("stop requested during start-up")
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
        if not starting.cancelled():
            starting.result()  # its error, if it failed

    async def _stop_when(self, gone: Callable[[], bool]) -> None:
        while not self._stop.is_set():
            if gone():
                log.info("the process that started this one is gone: stopping")
                self.request_stop()
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        await self.node.stop_changes()
        await self.supervisor.stop()
        log.info("shutting down: answering outstanding requests (up to %.1f s)", self.config.drain_s)
        if self.cells is not None:
            await self.cells.stop()  # each cell answers what it holds
        else:
            await self.node.drain()
        if self.cell is not None:
            await self.cell.stop()
        if self.front is not None:
            await self.front.stop()
        await self.node.close(self._ready)
        if self.tracing is not None:
            self.tracing.close()  # the spans still batched go out
        log.info("stopped")


def _tracing(config: ServeConfig, role: str) -> Tracing | None:
    """This process's tracer when ``otlp_endpoint`` is set; OpenTelemetry is imported only then."""
    if not config.otlp_endpoint:
        return None
    from mainspring.telemetry.tracing import Tracing

    return Tracing(config.otlp_endpoint, config.trace_sample_ratio, role)


def use_uvloop() -> None:
    """uvloop's event loop (``event_loop = "uvloop"``): the controller alone handled 1.65-1.9x the
    requests per second, through HTTP 1.04-1.24x, but live
    attainment fell (many models at 40 r/s: 97.9-98.1% against 99.3-99.4%; libuv's millisecond timers
    are the likely cause): not the default."""
    try:
        import uvloop
    except ImportError:
        raise RuntimeError("event_loop = 'uvloop' needs the uvloop package: pip install uvloop") from None
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run_server(
    config: ServeConfig,
    cell: CellRole | None = None,
    cells: CellsFront | None = None,
    watch: Callable[[], bool] | None = None,
) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` prints every thread's stack
    try:
        if config.event_loop == "uvloop":
            use_uvloop()
            log.info("event loop: uvloop")
        asyncio.run(Server(config, cell, cells).serve_until_stopped(watch))
    except (RuntimeError, OSError) as error:
        log.error("%s", error)
        return 1
    return 0
