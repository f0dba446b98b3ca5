"""The controller node: the live controller, the hub its workers join, and its workers: one process per
local device (every CUDA GPU, else one CPU device) that connects back over ZeroMQ exactly as a remote
worker would, or Ray actors on every node of a cluster; ``workers = "tcp"`` starts none and waits for
external ``mainspring worker`` processes. With ``repository_poll_s`` it serves what changes in the
repository folder."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from mainspring.controller.repository_poll import RepositoryPoller
from mainspring.controller.service import ControllerService
from mainspring.models.repository import ModelRepository
from mainspring.serving.config import ServeConfig, ensure_repository
from mainspring.serving.ray_placement import RayPlacer, RayWorkers
from mainspring.serving.supervision import Flock, LocalWorker, wait_for_exit
from mainspring.time import NO_LEDGER, CpuLedger
from mainspring.transport.security import SECRET_ENV
from mainspring.transport.zmq_hub import WorkerHub

if TYPE_CHECKING:
    from mainspring.telemetry.tracing import Tracing

log = logging.getLogger("mainspring.serve")


class ControllerNode:
    """The controller and its workers. ``cell``: this node is that cell of several (its local workers'
    names say so); ``plans``: False in front of cells, where the cells plan and this hub never opens."""

    def __init__(
        self, config: ServeConfig, cell: int | None = None, plans: bool = True, tracing: Tracing | None = None
    ) -> None:
        self.config = config
        self.cell = cell
        self.service = ControllerService(
            config.policy,
            config.slo_ms,
            deadline_margin_ms=config.deadline_margin_ms,
            max_outstanding=config.max_outstanding,
            max_outstanding_bytes=config.max_outstanding_mib * 1024 * 1024,
            max_loop_lag_ms=config.max_loop_lag_ms or None,
            log_dir=Path(config.log_dir).expanduser() if config.log_dir else None,
            policy_settings=config.clockwork,
            ledger=CpuLedger() if config.cpu_ledger else NO_LEDGER,
            tracing=tracing,
        )
        self.repo: ModelRepository | None = None
        self._worker_dir: tempfile.TemporaryDirectory[str] | None = None  # the local workers' private channel
        self.worker_secret = config.worker_secret  # or one made for this run (workers on Ray)
        self.hub = WorkerHub(
            self._worker_channel() if plans else "",
            self.service.worker_events,
            config.heartbeat_s,
            config.worker_timeout_s,
            secret=self.worker_secret,
            ledger=self.service.ledger,
        )
        self.local: list[LocalWorker] = []
        self._ray: RayPlacer | None = None
        self._poller: asyncio.Task[None] | None = None

    async def open_repository(self) -> None:
        """Remote workers bring their own models: a folder here is their repository only when named (the
        default zoo's models, listed as unavailable, were none of theirs)."""
        config = self.config
        self.repo = await asyncio.to_thread(ensure_repository, config) if config.workers == "local" else (
            ModelRepository(config.repo_path) if config.repo and config.repo_path.is_dir() else None
        )  # fmt: skip
        if config.workers == "local" and self.repo is not None:  # the workers serve this repository: no other model
            self.service.worker_events.known_models = self.repo.models

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

    def check_devices(self) -> None:
        """A device this machine cannot serve ends the server before any worker starts."""
        from mainspring.worker.torch_worker import torch_device

        for device in self.config.device_list():
            try:
                torch_device(device)
            except ValueError as error:
                raise RuntimeError(f"cannot serve on {device!r}: {error}") from None

    async def start_workers(self) -> None:
        """Its workers, once they joined: on Ray, or local processes; none for ``workers = "tcp"``."""
        if self.config.ray:
            await self._start_ray_workers()
        elif self.config.workers == "local":
            self._start_local_workers()
            await self._wait_for_workers(len(self.local))

    def flock(self) -> Flock:
        """The local workers, for the supervisor: each restart counted in the controller's metrics."""
        return Flock(self.local, self.worker_env, "local worker ", self.service.metrics.worker_restarts.inc)

    def _start_local_workers(self) -> None:
        assert self.repo is not None
        cell = f"cell-{self.cell}-" if self.cell is not None else ""
        for index, device in enumerate(self.config.device_list()):
            name = f"{cell}local-{index}-{device}"
            command = [sys.executable, "-m", "mainspring.cli", "worker", "--controller", self.hub.endpoint,
                       "--device", device, "--repo", str(self.repo.root), "--name", name,
                       "--parent-pid", str(os.getpid())]  # fmt: skip
            if self.config.pool_mib:
                command += ["--pool-mib", str(self.config.pool_mib)]
            if self.config.pin_cpu_workers and device == "cpu":
                command += ["--pin-core", str(-1 - index)]  # from the last core down; the controller keeps core 0
            self.local.append(LocalWorker(name, command, subprocess.Popen(command, env=self.worker_env())))

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

    def worker_env(self) -> dict[str, str]:
        """The environment of a local worker: ours, with the worker secret (never on its command line)."""
        env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
        if self.worker_secret:
            env[SECRET_ENV] = self.worker_secret
        return env

    async def _wait_for_workers(self, count: int) -> None:
        deadline = asyncio.get_running_loop().time() + self.config.join_timeout_s
        while len(self.service.workers) < count:  # a stop asked meanwhile cancels this (``_start_unless_stopped``)
            if any(w.process.poll() is not None for w in self.local):
                raise RuntimeError("a local worker process exited during start-up (see its log above)")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"workers did not join within {self.config.join_timeout_s:.0f} s")
            await asyncio.sleep(0.05)
        models = ", ".join(sorted(self.service.models)) or "(none)"
        log.info("ready: %d worker(s), %d device(s); serving %s", len(self.service.workers),
                 self.service.device_count, models)  # fmt: skip
        for model, error in sorted(self.service.load_errors.items()):
            log.error("not serving %s: %s", model, error)

    def start_polling(self) -> None:
        """Triton's poll mode, when set: from now on, what changes in the repository is served."""
        if not self.config.repository_poll_s:
            return
        if self.repo is None:
            log.warning("repository_poll_s is set, but this controller has no repository to read (%s)",
                        self.config.repo_path)  # fmt: skip
            return
        poller = RepositoryPoller(self.service, self.repo, self.config.repository_poll_s)
        self._poller = asyncio.create_task(poller.run())
        log.info("polling %s every %g s: new models are loaded, changed ones reloaded, removed ones unloaded",
                 self.repo.root, self.config.repository_poll_s)  # fmt: skip

    async def stop_changes(self) -> None:
        """Before the drain: no model load starts, and no worker is placed on Ray again, meanwhile."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._ray is not None:
            self._ray.stop_placing()

    async def drain(self) -> None:
        left = await self.service.drain(self.config.drain_s)
        if left:
            log.warning("%d request(s) answered with an error at shutdown", left)

    async def close(self, ready: bool) -> None:
        """After the drain: the workers told bye and, local ones, waited for (killed at once when not
        ``ready``: still loading models, nothing of theirs to finish)."""
        if self._ray is not None:
            await asyncio.to_thread(self._ray.stop)
        await self.hub.close()
        if self._worker_dir is not None:
            self._worker_dir.cleanup()
        for process in (w.process for w in self.local):
            if not ready:
                process.kill()
            await wait_for_exit(process, 10, subprocess.Popen.terminate, 5)


def _node_ip() -> str:
    """This machine's address as Ray's nodes reach it."""
    return str(importlib.import_module("ray.util").get_node_ip_address())
