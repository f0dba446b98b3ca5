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
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import deque
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from mainspring.controller.frontends import FrontendHub
from mainspring.controller.service import DEFAULT_DEADLINE_MARGIN_MS, ControllerService
from mainspring.frontend.access import Access
from mainspring.frontend.dataplane import DataPlane
from mainspring.frontend.http import make_app
from mainspring.frontend.limits import RequestLimits
from mainspring.frontend.remote import TOKEN_ENV, FrontendSpec
from mainspring.models.repository import ModelRepository
from mainspring.ray_cluster import RayPlacer, RayWorkers
from mainspring.scheduler.registry import DEFAULT_POLICY, policy_names
from mainspring.transport.security import SECRET_ENV
from mainspring.transport.zmq_hub import WorkerHub

log = logging.getLogger("mainspring.serve")

ENV_PREFIX = "MAINSPRING_"
DEFAULT_ZOO = ("resnet18", "mobilenetv2", "bert_tiny", "mlp")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServeConfig:
    """Every setting of ``mainspring serve``; from defaults, a TOML file, ``MAINSPRING_*`` variables, then flags."""

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    worker_port: int = 8002
    workers: str = "local"  # or "tcp": wait for external workers
    frontends: int = 0  # HTTP + gRPC frontend processes sharing the ports; 0: one per two cores, at most 4
    ray: str = ""  # a Ray cluster's address ("auto": the local one): one worker per device of each node, as actors
    repo: str = ""  # default: ~/.mainspring/zoo, created with the built-in zoo on first start
    policy: str = DEFAULT_POLICY
    slo_ms: float = 100.0
    deadline_margin_ms: float = DEFAULT_DEADLINE_MARGIN_MS  # time kept for the answer's trip back
    devices: str = ""  # comma-separated; default every CUDA GPU, else "cpu"
    pool_mib: int = 0  # per device; 0 = the runtime's default
    pin_cpu_workers: bool = False  # pin each local CPU worker's exec thread to its own core (the last ones)
    heartbeat_s: float = 0.1
    worker_timeout_s: float = 2.0
    drain_s: float = 5.0
    join_timeout_s: float = 180.0
    max_restarts_per_minute: int = 5  # per local worker
    max_outstanding: int = 100_000  # unanswered requests; past it 429 (bounds memory under a flood)
    log_dir: str = ""  # write request and action logs (TSV) here, for `mainspring analyze`
    max_outstanding_mib: int = 512  # their input tensors (the server holds about 3x this); past it 429
    # The controller's event loop this far behind: new requests 429 (its CPU is spent); 0: half of slo_ms.
    max_loop_lag_ms: float = 0.0
    # "uvloop": more requests/s through one controller, but its millisecond timers cost attainment
    # (docs/benchmarks.md); needs `pip install uvloop`.
    event_loop: str = "asyncio"
    # Security: set the secrets in the config file or the environment, never as flags (``ps`` shows flags).
    auth_token: str = field(default="", repr=False)  # bearer token for the repository API (and see auth_inference)
    auth_inference: bool = False  # require the token for inference, metadata, statistics and metrics too
    worker_secret: str = field(default="", repr=False)  # workers must hold it to join (ZeroMQ CURVE)
    # What one request may be (``frontend/limits.py``).
    max_body_bytes: int = RequestLimits.max_body_bytes
    max_header_bytes: int = RequestLimits.max_header_bytes
    max_inputs: int = RequestLimits.max_inputs
    max_elements: int = RequestLimits.max_elements
    max_string_bytes: int = RequestLimits.max_string_bytes
    max_json_depth: int = RequestLimits.max_json_depth

    def __post_init__(self) -> None:
        problems = []
        for port in ("http_port", "grpc_port", "worker_port"):
            if not 0 <= getattr(self, port) <= 65535:
                problems.append(f"{port}={getattr(self, port)} is not a port")
        if self.workers not in ("local", "tcp"):
            problems.append(f"workers={self.workers!r} must be 'local' or 'tcp'")
        if self.policy not in policy_names():
            problems.append(f"policy={self.policy!r} is not one of {', '.join(policy_names())}")
        if not 0 <= self.deadline_margin_ms < self.slo_ms:
            problems.append(f"deadline_margin_ms={self.deadline_margin_ms} must lie in [0, slo_ms)")
        if self.event_loop not in ("asyncio", "uvloop"):
            problems.append(f"event_loop={self.event_loop!r} must be 'asyncio' or 'uvloop'")
        if self.max_loop_lag_ms < 0:
            problems.append(f"max_loop_lag_ms={self.max_loop_lag_ms} must not be negative")
        if self.ray and self.workers != "local":
            problems.append("ray places the workers itself: leave workers at 'local'")
        if self.frontends < 0:
            problems.append(f"frontends={self.frontends} must not be negative (0: sized to the machine)")
        if self.max_restarts_per_minute < 0:
            problems.append(f"max_restarts_per_minute={self.max_restarts_per_minute} must not be negative")
        if self.auth_inference and not self.auth_token:
            problems.append("auth_inference needs auth_token to be set")
        try:
            self.limits()
        except ValueError as error:
            problems.append(str(error))
        for positive in (
            "slo_ms",
            "heartbeat_s",
            "worker_timeout_s",
            "join_timeout_s",
            "max_outstanding",
            "max_outstanding_mib",
        ):
            if not getattr(self, positive) > 0:
                problems.append(f"{positive}={getattr(self, positive)} must be positive")
        if problems:
            raise ValueError("bad serve configuration: " + "; ".join(problems))

    def limits(self) -> RequestLimits:
        return RequestLimits(**{f.name: getattr(self, f.name) for f in fields(RequestLimits)})

    @property
    def repo_path(self) -> Path:
        return Path(self.repo).expanduser() if self.repo else Path.home() / ".mainspring" / "zoo"

    @property
    def frontend_count(self) -> int:
        """Frontend processes in all, this one included."""
        return self.frontends or max(1, min(4, (os.cpu_count() or 1) // 2))

    def device_list(self) -> list[str]:
        if self.devices:
            return [d.strip() for d in self.devices.split(",") if d.strip()]
        import torch

        return [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]


def load_config(file: Path | None, environ: dict[str, str], flags: dict[str, Any]) -> ServeConfig:
    """Merge the sources; each value is converted to the field's type, with an error naming the source."""
    values: dict[str, Any] = {}
    known = {f.name: f for f in fields(ServeConfig)}
    if file is not None:
        try:
            document = tomllib.loads(file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ValueError(f"cannot read config file {file}: {error}") from None
        section = document.get("serve", document)
        for key, value in section.items():
            values[_field(key, known, f"config file {file}")] = value
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and key != f"{ENV_PREFIX}HOME":
            values[_field(key[len(ENV_PREFIX) :].lower(), known, f"environment variable {key}")] = value
    values.update({k: v for k, v in flags.items() if v is not None})
    converted: dict[str, Any] = {}
    for key, value in values.items():
        kind = type(getattr(ServeConfig(), key))
        try:
            converted[key] = _boolean(value) if kind is bool else kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"setting {key}={value!r} is not a {kind.__name__}") from None
    return replace(ServeConfig(), **converted)


def _boolean(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _field(key: str, known: dict[str, Any], where: str) -> str:
    name = key.replace("-", "_")
    if name not in known:
        raise ValueError(f"{where}: unknown setting {key!r}; known: {', '.join(known)}")
    return name


def ensure_repository(config: ServeConfig) -> ModelRepository:
    """The configured repository; the built-in zoo is written there on first start."""
    path = config.repo_path
    if not path.exists() and not config.repo:
        from mainspring.models.loading import export_zoo_model

        log.info("first start: writing the built-in zoo into %s", path)
        path.mkdir(parents=True)
        repo = ModelRepository(path)
        for name in DEFAULT_ZOO:
            export_zoo_model(repo, name)
        return repo
    return ModelRepository(path)


RESTART_BACKOFF_S = (0.5, 30.0)  # first delay, longest delay


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


class Server:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.service = ControllerService(
            config.policy,
            config.slo_ms,
            deadline_margin_ms=config.deadline_margin_ms,
            max_outstanding=config.max_outstanding,
            max_outstanding_bytes=config.max_outstanding_mib * 1024 * 1024,
            max_loop_lag_ms=config.max_loop_lag_ms or None,
            log_dir=Path(config.log_dir).expanduser() if config.log_dir else None,
        )
        self.repo: ModelRepository | None = None
        self.hub = WorkerHub(
            f"tcp://{config.host}:{config.worker_port}",
            self.service,
            config.heartbeat_s,
            config.worker_timeout_s,
            secret=config.worker_secret,
        )
        self._runner: web.AppRunner | None = None
        self._grpc: Any = None
        self._local: list[LocalWorker] = []
        self._frontends: list[LocalWorker] = []
        self._ray: RayPlacer | None = None
        self._frontend_hub: FrontendHub | None = None
        self._channel_dir: tempfile.TemporaryDirectory[str] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        config = self.config
        self.repo = await asyncio.to_thread(ensure_repository, config) if config.workers == "local" else (
            ModelRepository(config.repo_path) if config.repo_path.is_dir() else None
        )  # fmt: skip
        await self.hub.start()
        access = Access(config.auth_token, config.auth_inference)
        plane = DataPlane(self.service, self.repo, limits=config.limits(), access=access)
        if config.host not in LOOPBACK:
            if not config.auth_token:
                log.warning("listening on %s without auth_token: anyone who reaches it can load and unload models",
                            config.host)  # fmt: skip
            if not config.worker_secret:
                log.warning("listening on %s without worker_secret: anyone who reaches port %d can join as a worker",
                            config.host, config.worker_port)  # fmt: skip
        # Requests were answered by the drain; idle connections must not hold the shutdown for aiohttp's 60 s.
        self._runner = web.AppRunner(make_app(plane), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        shared = config.frontend_count > 1  # ports shared with the frontend processes (SO_REUSEPORT)
        await web.TCPSite(self._runner, config.host, config.http_port, reuse_port=shared or None).start()
        from mainspring.frontend.grpc import start_grpc

        self._grpc = await start_grpc(plane, f"{config.host}:{config.grpc_port}")
        log.info("HTTP on http://%s:%d, gRPC on %s:%d, workers connect to %s",
                 config.host, config.http_port, config.host, config.grpc_port, self.hub.endpoint)  # fmt: skip
        if shared:
            await self._start_frontends(config.frontend_count - 1)
        if config.ray:
            await self._start_ray_workers()
        elif config.workers == "local":
            self._start_local_workers()
            await self._wait_for_workers(len(self._local))
        if self._local or self._frontends:
            self._supervisor = asyncio.create_task(self._supervise())

    def _start_local_workers(self) -> None:
        assert self.repo is not None
        for index, device in enumerate(self.config.device_list()):
            name = f"local-{index}-{device}"
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
        self._frontend_hub = FrontendHub(self.service, endpoint)
        await self._frontend_hub.start()
        limits = {f.name: getattr(config, f.name) for f in fields(RequestLimits)}
        repo = str(self.repo.root) if self.repo else ""
        for index in range(1, count + 1):
            spec = FrontendSpec(endpoint, f"frontend-{index}", config.host, config.http_port, config.grpc_port,
                                os.getpid(), repo, limits, config.auth_inference)  # fmt: skip
            command = [sys.executable, "-m", "mainspring.frontend.remote", msgspec.json.encode(spec).decode()]
            self._frontends.append(LocalWorker(spec.name, command, subprocess.Popen(command, env=self._frontend_env())))
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._frontend_hub.joined < count:
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
                             config.worker_secret)  # fmt: skip
        self._ray = RayPlacer(config.ray, workers)
        await asyncio.to_thread(self._ray.start)
        log.info("placing workers on the Ray cluster at %s", config.ray)
        await self._wait_for_workers(1)

    def _frontend_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (SECRET_ENV, TOKEN_ENV)}
        if self.config.auth_token:
            env[TOKEN_ENV] = self.config.auth_token
        return env

    def _worker_env(self) -> dict[str, str]:
        """The environment of a local worker: ours, with the worker secret (never on its command line)."""
        env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
        if self.config.worker_secret:
            env[SECRET_ENV] = self.config.worker_secret
        return env

    async def _supervise(self, period_s: float = 0.2) -> None:
        """Start again every local worker that exited, with backoff and a bound per minute."""
        while not self._stop.is_set():
            await asyncio.sleep(period_s)
            now = time.monotonic()
            for worker in self._local + self._frontends:
                code = worker.process.poll()
                if code is None or self._stop.is_set():
                    continue
                recent = worker.restarts_in_last_minute(now)
                if worker.restart_at is None:
                    if self.config.max_restarts_per_minute == 0:
                        log.error("local worker %s exited with code %s; not restarting it", worker.name, code)
                        worker.restart_at = float("inf")
                        continue
                    first, longest = RESTART_BACKOFF_S
                    delay = min(longest, first * 2**recent)
                    if recent >= self.config.max_restarts_per_minute:  # wait for the oldest to leave the minute
                        delay = max(delay, 60.0 - (now - worker.restarts[0]))
                    worker.restart_at = now + delay
                    log.warning("local worker %s exited with code %s; starting it again in %.1f s "
                                "(%d restart(s) in the last minute)", worker.name, code, delay, recent)  # fmt: skip
                elif now >= worker.restart_at:
                    worker.restart_at = None
                    worker.restarts.append(now)
                    frontend = worker in self._frontends
                    env = self._frontend_env() if frontend else self._worker_env()
                    worker.process = subprocess.Popen(worker.command, env=env)
                    if not frontend:
                        self.service.metrics.worker_restarts.inc()
                    log.info("%s started again (pid %d)", worker.name, worker.process.pid)

    async def _wait_for_workers(self, count: int) -> None:
        deadline = asyncio.get_running_loop().time() + self.config.join_timeout_s
        while len(self.service.workers) < count:
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

    async def serve_until_stopped(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        await self._stop.wait()
        await self.stop()

    async def stop(self) -> None:
        if self._ray is not None:  # before the drain: no worker is placed again meanwhile
            self._ray.stop_placing()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        log.info("shutting down: answering outstanding requests (up to %.1f s)", self.config.drain_s)
        left = await self.service.drain(self.config.drain_s)
        if left:
            log.warning("%d request(s) answered with an error at shutdown", left)
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
        if self._ray is not None:
            await asyncio.to_thread(self._ray.stop)
        await self.hub.close()
        for process in (w.process for w in self._local):
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


def run_server(config: ServeConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` prints every thread's stack
    try:
        if config.event_loop == "uvloop":
            use_uvloop()
            log.info("event loop: uvloop")
        asyncio.run(Server(config).serve_until_stopped())
    except (RuntimeError, OSError) as error:
        log.error("%s", error)
        return 1
    return 0
