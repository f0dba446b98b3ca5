"""``mainspring serve``: controller, frontend (HTTP + gRPC) and local workers in one command.

The controller and the frontend share one asyncio loop in this process; each local device
gets a worker process (every CUDA GPU, else one CPU device) that connects back over
ZeroMQ, exactly as a remote worker would. ``workers = "tcp"`` starts none and waits for
external ``mainspring worker`` processes. A local worker that exits (a crash, the OOM killer)
is started again: after a backoff that doubles with each restart in the last minute, and at
most ``max_restarts_per_minute`` times a minute; its device rejoins when it says hello.
SIGINT/SIGTERM: stop accepting, answer what is outstanding (up to ``drain_s``), say bye to the
workers, wait for the local ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import msgspec
from aiohttp import web

from mainspring.cells.routing import CellSignal
from mainspring.cells.signal import cell_signal
from mainspring.cells.wire import SignalPublisher
from mainspring.controller.frontends import FrontendHub
from mainspring.controller.repository_poll import RepositoryPoller
from mainspring.controller.service import ControllerService
from mainspring.frontend.access import Access
from mainspring.frontend.dataplane import DataPlane
from mainspring.frontend.http import start_http
from mainspring.frontend.limits import RequestLimits
from mainspring.frontend.port import ControllerPort
from mainspring.frontend.process import TOKEN_ENV, FrontendSpec
from mainspring.models.repository import ModelRepository
from mainspring.serving.config import LOOPBACK, ServeConfig, ensure_repository
from mainspring.serving.ray_placement import RayPlacer, RayWorkers
from mainspring.transport.ports import check_port_free
from mainspring.transport.security import SECRET_ENV
from mainspring.transport.zmq_hub import WorkerHub

log = logging.getLogger("mainspring.serve")

RESTART_BACKOFF_S = (0.5, 30.0)  # first delay, longest delay
EXITED, RESTARTED = "exited", "restarted"  # what ``LocalWorker.look`` saw


@dataclass
class LocalWorker:
    """A child process this server keeps running (a device's worker, or a frontend), and when it was restarted."""

    name: str
    command: list[str]
    process: subprocess.Popen[bytes]
    restarts: deque[float] = field(default_factory=deque)  # monotonic times, the last minute's
    restart_at: float | None = None  # when the next start is due, once the process has exited

    def restarts_in_last_minute(self, now: float) -> int:
        while self.restarts and now - self.restarts[0] > 60.0:
            self.restarts.popleft()
        return len(self.restarts)

    def restart_delay(self, now: float, max_per_minute: int) -> float | None:
        """How long to wait before starting it again: a backoff that doubles with each restart in the last
        minute, and past ``max_per_minute`` until the oldest leaves the minute; None: never (0 a minute)."""
        if max_per_minute == 0:
            return None
        recent = self.restarts_in_last_minute(now)
        first, longest = RESTART_BACKOFF_S
        delay: float = min(longest, first * 2.0**recent)
        if recent >= max_per_minute:
            delay = max(delay, 60.0 - (now - self.restarts[0]))
        return delay

    def look(self, now: float, max_per_minute: int, env: Callable[[], dict[str, str]], label: str = "") -> str | None:
        """One look at the process: ``EXITED`` when its exit is first seen (a restart is then due after
        ``restart_delay``, or never), ``RESTARTED`` when it is started again, else None."""
        code = self.process.poll()
        if code is None:
            return None
        what = f"{label}{self.name}"
        if self.restart_at is None:
            delay = self.restart_delay(now, max_per_minute)
            if delay is None:
                log.error("%s exited with code %s; not restarting it", what, code)
                self.restart_at = float("inf")
            else:
                self.restart_at = now + delay
                log.warning("%s exited with code %s; starting it again in %.1f s (%d restart(s) in the last "
                            "minute)", what, code, delay, len(self.restarts))  # fmt: skip
            return EXITED
        if now < self.restart_at:
            return None
        self.restart_at = None
        self.restarts.append(now)
        self.process = subprocess.Popen(self.command, env=env())
        log.info("%s started again (pid %d)", what, self.process.pid)
        return RESTARTED


@dataclass(frozen=True)
class CellRole:
    """This server is cell ``index`` of a ``serve --cells N``: no HTTP or gRPC of its own; the frontends
    reach its controller on ``endpoint`` and read its load signal on ``signal_endpoint``."""

    index: int
    endpoint: str
    signal_endpoint: str


class CellsFront(Protocol):
    """The cells behind this server's frontends (``local_cells.py``): it starts and keeps them."""

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


class Server:
    def __init__(self, config: ServeConfig, cell: CellRole | None = None, cells: CellsFront | None = None) -> None:
        self.config = config
        self.cell = cell  # this server is one cell of several
        self.cells = cells  # this server's frontends serve several cells
        self.service = ControllerService(
            config.policy,
            config.slo_ms,
            deadline_margin_ms=config.deadline_margin_ms,
            max_outstanding=config.max_outstanding,
            max_outstanding_bytes=config.max_outstanding_mib * 1024 * 1024,
            max_loop_lag_ms=config.max_loop_lag_ms or None,
            log_dir=Path(config.log_dir).expanduser() if config.log_dir else None,
            policy_settings=config.clockwork,
        )
        self.repo: ModelRepository | None = None
        self._worker_dir: tempfile.TemporaryDirectory[str] | None = None  # the local workers' private channel
        self.worker_secret = config.worker_secret  # or one made for this run (workers on Ray)
        self.hub = WorkerHub(
            self._worker_channel() if cells is None else "",
            self.service,
            config.heartbeat_s,
            config.worker_timeout_s,
            secret=self.worker_secret,
        )
        self._runner: web.AppRunner | None = None
        self._plane: DataPlane | None = None
        self._grpc: Any = None
        self._local: list[LocalWorker] = []
        self._frontends: list[LocalWorker] = []
        self._ray: RayPlacer | None = None
        self._frontend_hub: FrontendHub | None = None
        self._channel_dir: tempfile.TemporaryDirectory[str] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._publisher: SignalPublisher | None = None
        self._incarnation = time.monotonic_ns()  # a cell's: tells the frontends a restarted process from a slow one
        self._stop = asyncio.Event()
        self._ready = False

    async def start(self) -> None:
        config = self.config
        if config.workers == "local" and not config.ray and self.cells is None:
            self._check_devices()
        # Remote workers bring their own models: a folder here is their repository only when named (the
        # default zoo's models, listed as unavailable, were none of theirs).
        self.repo = await asyncio.to_thread(ensure_repository, config) if config.workers == "local" else (
            ModelRepository(config.repo_path) if config.repo and config.repo_path.is_dir() else None
        )  # fmt: skip
        if config.workers == "local" and self.repo is not None:  # the workers serve this repository: no other model
            self.service.known_models = self.repo.models
        if self.cell is not None:
            await self._start_cell(self.cell)
            return
        if self.cells is not None:
            await self.cells.start()
        else:
            await self.hub.start()
        access = Access(config.auth_token, config.auth_inference)
        controller = self.service if self.cells is None else self.cells.port
        plane = self._plane = DataPlane(controller, self.repo, limits=config.limits(), access=access,
                                        shed=config.shed_at_arrival)  # fmt: skip
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
        workers = self.hub.endpoint
        if self.cells is not None:
            workers = "their cells, placed by Ray" if config.ray else (
                f"ports {config.worker_port}-{config.worker_port + config.cells - 1} (one per cell)")  # fmt: skip
            if config.workers == "local" and not (config.ray or config.worker_secret or config.allow_open_workers):
                workers = "their cell's private socket (ipc://, logged by each cell)"
        log.info("HTTP on http://%s:%d, gRPC on %s:%d, workers connect to %s",
                 config.host, config.http_port, config.host, config.grpc_port, workers)  # fmt: skip
        if shared:
            await self._start_frontends(config.frontend_count - 1)
        if self.cells is not None:
            self._ready = not self._stop.is_set()
            if self._frontends:
                self._supervisor = asyncio.create_task(self._supervise())
            return
        if config.ray:
            await self._start_ray_workers()
        elif config.workers == "local":
            self._start_local_workers()
            await self._wait_for_workers(len(self._local))
        if self._local or self._frontends:
            self._supervisor = asyncio.create_task(self._supervise())
        if config.repository_poll_s:
            self._start_polling()
        self._ready = not self._stop.is_set()  # else a stop came while the workers loaded

    async def _start_cell(self, cell: CellRole) -> None:
        """One cell: the controller, its workers, the channel to the frontends and the load signal."""
        await self.hub.start()
        self.service.in_line = False  # it may have missed repository changes: the server's port says when not
        self._frontend_hub = FrontendHub(self.service, cell.endpoint, secret=self.config.worker_secret)
        await self._frontend_hub.start()
        self._publisher = SignalPublisher(cell.signal_endpoint, self._signal, self.config.worker_secret)
        self._publisher.start()
        self.service.guard.tick_listeners.append(self._publisher.tick)
        if self.config.workers == "local":
            self._start_local_workers()
            await self._wait_for_workers(len(self._local))
        if self._local:
            self._supervisor = asyncio.create_task(self._supervise())
        if self.config.repository_poll_s:
            self._start_polling()
        self._ready = not self._stop.is_set()

    def _signal(self) -> CellSignal:
        """This cell's load signal, under the names clients use (``ServedModel.key`` inside)."""
        assert self.cell is not None
        service = self.service
        names = {served.key: name for name, served in service.models.items()}
        now = service.clock.now_ns()
        signal = cell_signal(self.cell.index, service.policy, service.device_count, now, names)
        finish = {names[key]: end for key, end in signal.finish_ns.items()}
        return CellSignal(signal.cell, signal.at_ns, signal.devices, finish, signal.cold_start_ns, self._incarnation)

    def _worker_channel(self) -> str:
        """Where workers connect. Without ``worker_secret``: local workers over a socket in a folder only
        this user may enter; workers on Ray over TCP with a secret made for this run; TCP open to any
        process only with ``allow_open_workers``. With it: TCP, CURVE-authenticated and encrypted."""
        config = self.config
        tcp = f"tcp://{config.host}:{config.worker_port}"
        if config.worker_secret:
            return tcp
        if config.allow_open_workers:
            log.warning("allow_open_workers: any process that reaches %s can join as a worker, receive "
                        "clients' inputs and answer for the models (set worker_secret to close it)", tcp)  # fmt: skip
            return tcp
        if config.ray:
            self.worker_secret = secrets.token_hex(32)
            log.info("no worker_secret is set: the workers on Ray use one made for this run")
            return tcp
        self._worker_dir = tempfile.TemporaryDirectory(prefix="mainspring-workers-")
        return f"ipc://{self._worker_dir.name}/workers"

    def _check_devices(self) -> None:
        from mainspring.worker.torch_worker import torch_device

        for device in self.config.device_list():
            try:
                torch_device(device)
            except ValueError as error:
                raise RuntimeError(f"cannot serve on {device!r}: {error}") from None

    def _start_local_workers(self) -> None:
        assert self.repo is not None
        cell = f"cell-{self.cell.index}-" if self.cell is not None else ""
        for index, device in enumerate(self.config.device_list()):
            name = f"{cell}local-{index}-{device}"
            command = [sys.executable, "-m", "mainspring.cli", "worker", "--controller", self.hub.endpoint,
                       "--device", device, "--repo", str(self.repo.root), "--name", name,
                       "--parent-pid", str(os.getpid())]  # fmt: skip
            if self.config.pool_mib:
                command += ["--pool-mib", str(self.config.pool_mib)]
            if self.config.pin_cpu_workers and device == "cpu":
                command += ["--pin-core", str(-1 - index)]  # from the last core down; the controller keeps core 0
            self._local.append(LocalWorker(name, command, subprocess.Popen(command, env=self._worker_env())))

    async def _start_frontends(self, count: int, timeout_s: float = 60.0) -> None:
        """``count`` more frontend processes on the same ports, each handing calls to the controller
        over a ZeroMQ socket in a folder only this user may enter."""
        config = self.config
        self._channel_dir = tempfile.TemporaryDirectory(prefix="mainspring-")
        endpoint = f"ipc://{self._channel_dir.name}/frontends"
        if self.cells is None:
            self._frontend_hub = FrontendHub(self.service, endpoint)
            await self._frontend_hub.start()
        cells = list(self.cells.endpoints) if self.cells is not None else []
        signals = list(self.cells.signal_endpoints) if self.cells is not None else []
        cells_file = self.cells.cells_file if self.cells is not None else ""
        limits = {f.name: getattr(config, f.name) for f in fields(RequestLimits)}
        repo = str(self.repo.root) if self.repo else ""
        # Shared-memory registrations are the server's: each frontend process reads them from one folder.
        shared_memory = str(self._plane.shared_memory.folder) if self._plane is not None else ""
        for index in range(1, count + 1):
            spec = FrontendSpec(endpoint, f"frontend-{index}", config.host, config.http_port, config.grpc_port,
                                os.getpid(), repo, limits, config.auth_inference, cells, signals,
                                cells_file, shared_memory=shared_memory, shed=config.shed_at_arrival)  # fmt: skip
            command = [sys.executable, "-m", "mainspring.frontend.process", msgspec.json.encode(spec).decode()]
            self._frontends.append(LocalWorker(spec.name, command, subprocess.Popen(command, env=self._frontend_env())))
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._frontend_hub is not None and self._frontend_hub.joined < count:
            if any(f.process.poll() is not None for f in self._frontends):
                raise RuntimeError("a frontend process exited during start-up (see its log above)")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"frontend processes did not join within {timeout_s:.0f} s")
            await asyncio.sleep(0.05)
        log.info("%d frontend process(es) share ports %d and %d", count + 1, config.http_port, config.grpc_port)

    async def _start_ray_workers(self) -> None:
        """Workers as Ray actors, one per device of each node; serving starts with the first to join."""
        assert self.repo is not None
        config = self.config
        host = config.host if config.host not in ("0.0.0.0", "::", "") else await asyncio.to_thread(_node_ip)
        workers = RayWorkers(f"tcp://{host}:{config.worker_port}", str(self.repo.root), config.pool_mib,
                             self.worker_secret)  # fmt: skip
        self._ray = RayPlacer(config.ray, workers)
        await asyncio.to_thread(self._ray.start)
        log.info("placing workers on the Ray cluster at %s", config.ray)
        await self._wait_for_workers(1)

    def _frontend_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (SECRET_ENV, TOKEN_ENV)}
        if self.cells is not None and self.config.ray and self.config.worker_secret:  # the cells' TCP channels
            env[SECRET_ENV] = self.config.worker_secret
        if self.config.auth_token:
            env[TOKEN_ENV] = self.config.auth_token
        return env

    def _worker_env(self) -> dict[str, str]:
        """The environment of a local worker: ours, with the worker secret (never on its command line)."""
        env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
        if self.worker_secret:
            env[SECRET_ENV] = self.worker_secret
        return env

    async def _supervise(self, period_s: float = 0.2) -> None:
        """Start again every local worker that exited, with backoff and a bound per minute."""
        while not self._stop.is_set():
            await asyncio.sleep(period_s)
            if self._stop.is_set():  # set while this slept: the processes are ending on purpose
                return
            now = time.monotonic()
            limit = self.config.max_restarts_per_minute
            for worker in self._local:
                if worker.look(now, limit, self._worker_env, "local worker ") == RESTARTED:
                    self.service.metrics.worker_restarts.inc()
            for frontend in self._frontends:
                frontend.look(now, limit, self._frontend_env)

    async def _wait_for_workers(self, count: int) -> None:
        deadline = asyncio.get_running_loop().time() + self.config.join_timeout_s
        while len(self.service.workers) < count:  # a stop asked meanwhile cancels this (``_start_unless_stopped``)
            if any(w.process.poll() is not None for w in self._local):
                raise RuntimeError("a local worker process exited during start-up (see its log above)")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"workers did not join within {self.config.join_timeout_s:.0f} s")
            await asyncio.sleep(0.05)
        models = ", ".join(sorted(self.service.models)) or "(none)"
        log.info("ready: %d worker(s), %d device(s); serving %s", len(self.service.workers),
                 self.service.device_count, models)  # fmt: skip
        for model, error in sorted(self.service.load_errors.items()):
            log.error("not serving %s: %s", model, error)

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

    def _start_polling(self) -> None:
        """Triton's poll mode: from now on, what changes in the repository is served."""
        if self.repo is None:
            log.warning("repository_poll_s is set, but this controller has no repository to read (%s)",
                        self.config.repo_path)  # fmt: skip
            return
        poller = RepositoryPoller(self.service, self.repo, self.config.repository_poll_s)
        self._poller = asyncio.create_task(poller.run())
        log.info("polling %s every %g s: new models are loaded, changed ones reloaded, removed ones unloaded",
                 self.repo.root, self.config.repository_poll_s)  # fmt: skip

    async def stop(self) -> None:
        if self._poller is not None:  # no model load starts during the drain
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._ray is not None:  # before the drain: no worker is placed again meanwhile
            self._ray.stop_placing()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        log.info("shutting down: answering outstanding requests (up to %.1f s)", self.config.drain_s)
        if self.cells is not None:
            await self.cells.stop()  # each cell answers what it holds
        else:
            left = await self.service.drain(self.config.drain_s)
            if left:
                log.warning("%d request(s) answered with an error at shutdown", left)
        if self._publisher is not None:
            self._publisher.close()
        for frontend in self._frontends:  # the calls they handed over are answered: let them go
            frontend.process.terminate()
        for frontend in self._frontends:
            try:
                await asyncio.to_thread(frontend.process.wait, 10)
            except subprocess.TimeoutExpired:
                frontend.process.kill()
        if self._frontend_hub is not None:
            await self._frontend_hub.close()
        if self._channel_dir is not None:
            self._channel_dir.cleanup()
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._plane is not None:
            self._plane.dropped.report()  # what the last interval saw, not left unlogged
            self._plane.shared_memory.close()  # registrations end with the server
            self._plane.gate.stop()
        if self._ray is not None:
            await asyncio.to_thread(self._ray.stop)
        await self.hub.close()
        if self._worker_dir is not None:
            self._worker_dir.cleanup()
        for process in (w.process for w in self._local):
            if not self._ready:  # still loading models (a SIGTERM waits for that): nothing of theirs to finish
                process.kill()
            try:
                await asyncio.to_thread(process.wait, 10)
            except subprocess.TimeoutExpired:
                process.terminate()
                await asyncio.to_thread(process.wait, 5)
        log.info("stopped")


def _node_ip() -> str:
    """This machine's address as Ray's nodes reach it."""
    import importlib

    return str(importlib.import_module("ray.util").get_node_ip_address())


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
