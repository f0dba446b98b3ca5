"""The frontends: HTTP and gRPC (KServe v2) in this process and, with ``frontends`` above 1, more
frontend processes on the same ports (``SO_REUSEPORT``), each handing its calls to the controller over
a ZeroMQ socket in a folder only this user may enter, or routing them to the cells itself."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from aiohttp import web

from mainspring.controller.frontends import FrontendHub
from mainspring.controller.service import ControllerService
from mainspring.frontend.access import Access
from mainspring.frontend.dataplane import DataPlane
from mainspring.frontend.http import start_http
from mainspring.frontend.limits import RequestLimits
from mainspring.frontend.port import ControllerPort
from mainspring.frontend.process import TOKEN_ENV, FrontendSpec
from mainspring.models.repository import ModelRepository
from mainspring.serving.config import LOOPBACK, ServeConfig
from mainspring.serving.supervision import Flock, LocalWorker, wait_for_exit
from mainspring.transport.ports import check_port_free
from mainspring.transport.security import SECRET_ENV

if TYPE_CHECKING:
    from mainspring.telemetry.tracing import Tracing

log = logging.getLogger("mainspring.serve")


class CellsFront(Protocol):
    """The cells behind this server's frontends (``local_cells.py``, ``ray_cells.py``): it starts and keeps them."""

    @property
    def port(self) -> ControllerPort: ...

    @property
    def endpoints(self) -> list[str]: ...

    @property
    def signal_endpoints(self) -> list[str]: ...

    @property
    def cells_file(self) -> str: ...  # cells added after the start, for the frontend processes ("": none)

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Frontends:
    """The server's ports and the processes that share them. Behind them either ``service`` (this
    process's controller) or ``cells``."""

    def __init__(
        self, config: ServeConfig, service: ControllerService, cells: CellsFront | None, tracing: Tracing | None = None
    ) -> None:
        self.config = config
        self._tracing = tracing
        self._service = service
        self._cells = cells
        self.processes: list[LocalWorker] = []
        self.plane: DataPlane | None = None
        self._runner: web.AppRunner | None = None
        self._grpc: Any = None
        self._hub: FrontendHub | None = None
        self._channel_dir: tempfile.TemporaryDirectory[str] | None = None

    async def start(self, repo: ModelRepository | None, workers_at: str) -> None:
        """Listen on the ports (``workers_at``: where the workers connect, for the log), then start the
        frontend processes that share them."""
        config = self.config
        access = Access(config.auth_token, config.auth_inference)
        controller = self._service if self._cells is None else self._cells.port
        plane = self.plane = DataPlane(controller, repo, limits=config.limits(), access=access,
                                       shed=config.shed_at_arrival, tracing=self._tracing)  # fmt: skip
        if config.host not in LOOPBACK and not config.auth_token:
            log.warning("listening on %s without auth_token: anyone who reaches it can load and unload models",
                        config.host)  # fmt: skip
        shared = config.frontend_count > 1  # ports shared with the frontend processes (SO_REUSEPORT)
        if shared:  # sharing must not extend to another server already on the ports
            for port, what in ((config.http_port, "HTTP"), (config.grpc_port, "gRPC")):
                check_port_free(config.host, port, what)
        self._runner = await start_http(plane, config.host, config.http_port, reuse_port=shared or None)
        from mainspring.frontend.grpc import start_grpc

        self._grpc = await start_grpc(plane, f"{config.host}:{config.grpc_port}", share_port=shared)
        log.info("HTTP on http://%s:%d, gRPC on %s:%d, workers connect to %s",
                 config.host, config.http_port, config.host, config.grpc_port, workers_at)  # fmt: skip
        if shared:
            await self._start_processes(config.frontend_count - 1, repo)

    def flock(self) -> Flock:
        return Flock(self.processes, self._env)

    async def _start_processes(self, count: int, repo: ModelRepository | None, timeout_s: float = 60.0) -> None:
        """``count`` more frontend processes on the same ports, each handing calls to the controller
        over a ZeroMQ socket in a folder only this user may enter."""
        config, cells = self.config, self._cells
        self._channel_dir = tempfile.TemporaryDirectory(prefix="mainspring-")
        endpoint = f"ipc://{self._channel_dir.name}/frontends"
        if cells is None:
            self._hub = FrontendHub(self._service, endpoint, shed=config.shed_at_arrival)
            await self._hub.start()
        limits = {f.name: getattr(config, f.name) for f in fields(RequestLimits)}
        # Shared-memory registrations are the server's: each frontend process reads them from one folder.
        shared_memory = str(self.plane.shared_memory.folder) if self.plane is not None else ""
        for index in range(1, count + 1):
            spec = FrontendSpec(endpoint, f"frontend-{index}", config.host, config.http_port, config.grpc_port,
                                os.getpid(), str(repo.root) if repo else "", limits, config.auth_inference,
                                list(cells.endpoints) if cells else [], list(cells.signal_endpoints) if cells else [],
                                cells.cells_file if cells else "", shared_memory=shared_memory,
                                shed=config.shed_at_arrival, otlp_endpoint=config.otlp_endpoint,
                                trace_sample_ratio=config.trace_sample_ratio)  # fmt: skip
            command = [sys.executable, "-m", "mainspring.frontend.process", msgspec.json.encode(spec).decode()]
            self.processes.append(LocalWorker(spec.name, command, subprocess.Popen(command, env=self._env())))
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._hub is not None and self._hub.joined < count:
            if any(f.process.poll() is not None for f in self.processes):
                raise RuntimeError("a frontend process exited during start-up (see its log above)")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"frontend processes did not join within {timeout_s:.0f} s")
            await asyncio.sleep(0.05)
        log.info("%d frontend process(es) share ports %d and %d", count + 1, config.http_port, config.grpc_port)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (SECRET_ENV, TOKEN_ENV)}
        if self._cells is not None and self.config.ray and self.config.worker_secret:  # the cells' TCP channels
            env[SECRET_ENV] = self.config.worker_secret
        if self.config.auth_token:
            env[TOKEN_ENV] = self.config.auth_token
        return env

    async def stop(self) -> None:
        """After the drain: the calls the processes handed over are answered, so they go, then the ports."""
        for frontend in self.processes:
            frontend.process.terminate()
        for frontend in self.processes:
            await wait_for_exit(frontend.process, 10, subprocess.Popen.kill)
        if self._hub is not None:
            await self._hub.close()
        if self._channel_dir is not None:
            self._channel_dir.cleanup()
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        if self._runner is not None:
            await self._runner.cleanup()
        if self.plane is not None:
            self.plane.dropped.report()  # what the last interval saw, not left unlogged
            self.plane.shared_memory.close()  # registrations end with the server
            self.plane.gate.stop()
