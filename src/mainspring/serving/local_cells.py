"""``mainspring serve --cells N``: the devices split into N cells, each planned by a controller process
of its own (a core each); the frontends in front of them route every request to a cell.

This process keeps the HTTP and gRPC ports (and ``--frontends``) and starts the cells: cell ``i`` is
a ``Server`` in its cell role (``python -m mainspring.serving.local_cells SPEC``) with its share of the local
devices, listening for workers on ``worker_port + i``, for the frontends on a ZeroMQ socket in a
folder only this user may enter, and publishing its load signal beside it. A cell that exits is
started again (the same backoff as a worker); meanwhile its models are served by the other cells.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from mainspring.frontend.cells_port import CellsPort
from mainspring.frontend.process import TOKEN_ENV
from mainspring.serving.cell import CellRole
from mainspring.serving.config import ServeConfig
from mainspring.serving.server import run_server
from mainspring.serving.supervision import EXITED, LocalWorker
from mainspring.transport.security import SECRET_ENV

log = logging.getLogger("mainspring.serve")

SECRET_FIELDS = ("auth_token", "worker_secret")  # never on a command line: the environment carries them


class CellSpec(msgspec.Struct, frozen=True):
    """What the front tells a cell process (as JSON on its command line)."""

    index: int
    endpoint: str
    signal_endpoint: str
    parent_pid: int  # 0: whichever process started it (on Ray, its actor)
    config: dict[str, Any]  # ServeConfig's fields, the secrets left out


def cell_config(config: ServeConfig, index: int, count: int) -> ServeConfig:
    """Cell ``index``'s settings: its share of the local devices, its own worker port and log folder."""
    devices = ""
    if config.workers == "local":
        listed = config.device_list()
        size, extra = divmod(len(listed), count)
        start = index * size + min(index, extra)
        devices = ",".join(listed[start : start + size + (1 if index < extra else 0)])
    log_dir = os.path.join(config.log_dir, f"cell-{index}") if config.log_dir else ""
    return dataclasses.replace(
        config, devices=devices, worker_port=config.worker_port + index, cells=1, frontends=1, log_dir=log_dir
    )


class Cells:
    """The cell processes of this server, and the ``CellsPort`` its frontends use (``serve.CellsFront``)."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        if config.workers == "local" and len(devices := config.device_list()) < config.cells:
            # a usage error (exit 2, one line), found before any process starts
            raise ValueError(f"--cells {config.cells} needs a device per cell, and the devices are {len(devices)} "
                             f"({','.join(devices)}); several cells may share a CPU: --devices cpu,cpu")  # fmt: skip
        self._dir = tempfile.TemporaryDirectory(prefix="mainspring-cells-")
        self._endpoints = [f"ipc://{self._dir.name}/cell-{i}" for i in range(config.cells)]
        self._signals = [f"ipc://{self._dir.name}/cell-{i}-signal" for i in range(config.cells)]
        self._port = CellsPort("main", self._endpoints, self._signals, settles=True)
        self._processes: list[LocalWorker] = []
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def port(self) -> CellsPort:
        return self._port

    @property
    def endpoints(self) -> list[str]:
        return self._endpoints

    @property
    def signal_endpoints(self) -> list[str]:
        return self._signals

    @property
    def cells_file(self) -> str:
        return ""  # the cells are all there from the start

    async def start(self) -> None:
        config = self.config
        for index in range(config.cells):
            values = {k: v for k, v in dataclasses.asdict(cell_config(config, index, config.cells)).items()
                      if k not in SECRET_FIELDS}  # fmt: skip
            spec = CellSpec(index, self._endpoints[index], self._signals[index], os.getpid(), values)
            command = [sys.executable, "-m", "mainspring.serving.local_cells", msgspec.json.encode(spec).decode()]
            self._processes.append(LocalWorker(f"cell-{index}", command, subprocess.Popen(command, env=self._env())))
        started = asyncio.create_task(self._port.start(config.join_timeout_s))
        try:
            while not started.done():
                if any(p.process.poll() is not None for p in self._processes):
                    raise RuntimeError("a cell process exited during start-up (see its log above)")
                await asyncio.sleep(0.05)
        finally:
            started.cancel()  # a failure, or a stop asked meanwhile (the start is cancelled)
        try:
            await started
        except TimeoutError:
            silent = [i for i, cell in enumerate(self._port.cells) if not cell.joined]
            raise RuntimeError(f"cells {silent} did not answer within {config.join_timeout_s:.0f} s") from None
        await self._wait_for_devices()
        self._supervisor = asyncio.create_task(self._supervise())
        log.info("%d cells ready: %s device(s)", config.cells, [c.device_count for c in self._port.cells])

    async def _wait_for_devices(self) -> None:
        config = self.config
        deadline = time.monotonic() + config.join_timeout_s
        said = False
        while waiting := [i for i, cell in enumerate(self._port.cells) if cell.device_count == 0]:
            where = (f"their workers join on ports {[config.worker_port + i for i in waiting]}"
                     if config.workers == "tcp" else "their local workers are loading models")  # fmt: skip
            if time.monotonic() > deadline:
                raise RuntimeError(f"cells {waiting} have no device after {config.join_timeout_s:.0f} s ({where})")
            if not said:
                log.info("waiting up to %.0f s for cells %s to have a device (%s)", config.join_timeout_s, waiting,
                         where)  # fmt: skip
                said = True
            await self._port.refresh()
            await asyncio.sleep(0.1)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (SECRET_ENV, TOKEN_ENV)}
        if self.config.worker_secret:
            env[SECRET_ENV] = self.config.worker_secret
        if self.config.auth_token:
            env[TOKEN_ENV] = self.config.auth_token
        return env

    async def _supervise(self, period_s: float = 0.2) -> None:
        """A cell that exits is started again, with a local worker's backoff and bound per minute (its
        workers join it again; its models are served by the other cells meanwhile)."""
        while True:
            await asyncio.sleep(period_s)
            if self._stopping:  # set by ``stop`` while this slept: its cells are ending on purpose
                return
            now = time.monotonic()
            for index, cell in enumerate(self._processes):
                if cell.look(now, self.config.max_restarts_per_minute, self._env) == EXITED:
                    self._port.dead(index, f"its process exited with code {cell.process.returncode}")

    async def stop(self) -> None:
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        for cell in self._processes:  # each drains: answers what it holds, then lets its workers go
            if cell.process.poll() is None:
                cell.process.terminate()
        for cell in self._processes:
            try:
                await asyncio.to_thread(cell.process.wait, self.config.drain_s + 15)
            except subprocess.TimeoutExpired:
                cell.process.kill()
        await self._port.close()
        self._dir.cleanup()


def run_cells(config: ServeConfig) -> int:
    return run_server(config, cells=Cells(config))


def main(argv: Sequence[str]) -> int:
    """A cell process: a ``Server`` in its cell role, until SIGTERM or the front's process is gone."""
    spec = msgspec.json.decode(argv[0], type=CellSpec)
    secrets = {"worker_secret": os.environ.get(SECRET_ENV, ""), "auth_token": os.environ.get(TOKEN_ENV, "")}
    config = ServeConfig(**{**spec.config, **secrets})
    watcher = _ParentWatch(spec.parent_pid or os.getppid())
    return run_server(config, cell=CellRole(spec.index, spec.endpoint, spec.signal_endpoint), watch=watcher.gone)


class _ParentWatch:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def gone(self) -> bool:
        return os.getppid() != self.pid


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
