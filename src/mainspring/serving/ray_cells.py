"""``mainspring serve --ray [ADDRESS] --cells N``: cells on a Ray cluster.

A cell is up to 16 devices of one node (``CELL_DEVICES``; a node of 8 GPUs is one cell). Its placement
group, pinned to that node, holds a bundle for its controller (a CPU) and one per device; the
controller (``python -m mainspring.serving.local_cells SPEC``, as a ``CellActor``) and the workers (as
``WorkerActor``\\ s) run there, so a cell's actions never cross the network. This process keeps the
HTTP and gRPC ports and routes every request to a cell (``CellsPort``), as ``serve --cells N`` does
on one machine; the cells' channels are TCP ports on their nodes instead of local sockets:

- cell ``i`` takes its workers on ``worker_port + 3i`` of its node, its frontends on the port after,
  and publishes its load signal on the next; all three are CURVE-encrypted with the worker secret
  (one made for the run when none is set), so only this server's processes reach them;
- a cell whose controller exits is started again in its bundle, on the same ports: its workers
  (``--rejoin``) say hello to it again with the weights they hold, and meanwhile the other cells
  serve its models;
- a node that joins the cluster brings new cells; one that leaves takes its cells with it;
- serving starts once ``N`` cells have devices: ``N`` is how many the cluster has at the start, and
  more come as nodes join; ``--frontends`` processes follow the list of cells in a file the server
  rewrites (new ones joined, departed ones dropped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from mainspring.cells.placement import CELL_DEVICES
from mainspring.frontend.cells_port import CellsPort
from mainspring.frontend.process import TOKEN_ENV
from mainspring.serving.config import ServeConfig
from mainspring.serving.local_cells import SECRET_FIELDS, CellSpec
from mainspring.serving.ray_placement import RayPlacer, RayWorkers
from mainspring.serving.server import run_server
from mainspring.transport.security import SECRET_ENV

log = logging.getLogger("mainspring.serve")

PORTS_PER_CELL = 3  # cell i: workers on worker_port + 3i, its frontends on the next port, its signal after


class RayCells:
    """The cells of this server on a Ray cluster (``serve.CellsFront``), and the ``CellsPort`` its frontends
    use. The placer (``RayPlacer``, its own thread) reserves, starts and restarts them; this side names
    them and tells the port."""

    def __init__(self, config: ServeConfig, secret_made: bool = False) -> None:
        self.config = config
        self._secret_made = secret_made  # the worker secret was made for this run (none was set)
        self._dir: tempfile.TemporaryDirectory[str] | None = None  # the cells file's, from the start
        self._endpoints: list[str] = []
        self._signals: list[str] = []
        self._addresses: list[str] = []  # each cell's node
        self._departed: list[bool] = []
        self._lock = threading.Lock()
        self._port = CellsPort("main", [], [], secret=config.worker_secret, settles=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._placer: RayPlacer | None = None

    @property
    def port(self) -> CellsPort:
        return self._port

    @property
    def endpoints(self) -> list[str]:
        return []  # the frontend processes read every cell from the cells file, as it changes

    @property
    def signal_endpoints(self) -> list[str]:
        return []

    @property
    def cells_file(self) -> str:
        return str(self._file)

    @property
    def _file(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name) / "cells.json"

    async def start(self) -> None:
        config = self.config
        self._loop = asyncio.get_running_loop()
        self._dir = tempfile.TemporaryDirectory(prefix="mainspring-cells-")
        await self._port.start(config.join_timeout_s)
        self._write_cells_file()
        workers = RayWorkers("", str(config.repo_path), config.pool_mib, config.worker_secret)
        self._placer = RayPlacer(config.ray, workers, cells=self, cell_devices=CELL_DEVICES)
        await asyncio.to_thread(self._placer.start)
        log.info("placing cells on the Ray cluster at %s", config.ray)
        if self._secret_made:
            log.info("no worker_secret is set: the cells' channels use one made for this run")
        await self._wait_for_cells(config.cells)

    async def _wait_for_cells(self, count: int) -> None:
        deadline = time.monotonic() + self.config.join_timeout_s
        # ready: with devices, and in line (the server's port compared it with the others and told it)
        while (ready := sum(1 for cell in self._port.cells if cell.device_count > 0 and cell.in_line)) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"cells={count}, but {ready} cell(s) have devices after {self.config.join_timeout_s:.0f} s: "
                    f"a cell is up to {CELL_DEVICES} devices of one node, with a CPU there for its controller; "
                    "does the cluster have the nodes?"
                )
            await self._port.refresh()
            await asyncio.sleep(0.2)
        log.info("%d cells ready on Ray: %s device(s)", ready, [c.device_count for c in self._port.cells])

    async def stop(self) -> None:
        if self._placer is not None:  # each cell drains (answers what it holds), then every actor ends
            await asyncio.to_thread(self._placer.stop, self.config.drain_s)
        with self._lock:
            self._loop = None  # a placer thread that outlived its join tells no one now
        await self._port.close()
        if self._dir is not None:
            self._dir.cleanup()

    # --- what the placer asks (its thread) -----------------------------------------------------------
    def new_cell(self, address: str, devices: int) -> int:
        with self._lock:
            index = len(self._endpoints)
            port = self.config.worker_port + PORTS_PER_CELL * index + 1
            endpoint, signal = f"tcp://{address}:{port}", f"tcp://{address}:{port + 1}"
            self._endpoints.append(endpoint)
            self._signals.append(signal)
            self._addresses.append(address)
            self._departed.append(False)
            self._write_cells_file()
            self._on_loop(self._port.add_cell, endpoint, signal)
        log.info("cell %d: %d device(s) on the Ray node at %s", index, devices, address)
        return index

    def _write_cells_file(self) -> None:
        """Every cell as [endpoint, signal, departed], for the frontend processes (``CellsPort``)."""
        if self._dir is None:
            return
        listed = json.dumps(list(zip(self._endpoints, self._signals, self._departed, strict=True)))
        written = self._file.with_suffix(".tmp")
        written.write_text(listed)
        os.replace(written, self._file)  # a frontend process never reads half a list

    def cell_process(self, cell: int) -> tuple[list[str], dict[str, str]]:
        config = self.config
        cell_settings = dataclasses.replace(
            config,
            host=self._addresses[cell],
            workers="tcp",  # the placer runs its workers, as actors beside it
            worker_port=config.worker_port + PORTS_PER_CELL * cell,
            repo=str(config.repo_path),  # the path its workers are given, not the node user's default
            ray="",
            devices="",
            cells=1,
            frontends=1,
            log_dir=os.path.join(config.log_dir, f"cell-{cell}") if config.log_dir else "",
        )
        values = {k: v for k, v in dataclasses.asdict(cell_settings).items() if k not in SECRET_FIELDS}
        spec = CellSpec(cell, self._endpoints[cell], self._signals[cell], 0, values)
        environment = {SECRET_ENV: config.worker_secret} if config.worker_secret else {}
        if config.auth_token:
            environment[TOKEN_ENV] = config.auth_token
        return ["mainspring.serving.local_cells", msgspec.json.encode(spec).decode()], environment

    def worker_endpoint(self, cell: int) -> str:
        return f"tcp://{self._addresses[cell]}:{self.config.worker_port + PORTS_PER_CELL * cell}"

    def cell_gone(self, cell: int, why: str, for_good: bool) -> None:
        with self._lock:
            if for_good:
                self._departed[cell] = True
                self._write_cells_file()
            self._on_loop(self._port.depart if for_good else self._port.dead, cell, why)

    def _on_loop(self, call: Callable[..., Any], *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(call, *args)


def run_ray_cells(config: ServeConfig) -> int:
    made = not config.worker_secret  # the cells' channels are TCP ports on their nodes: never open ones
    if made:
        config = dataclasses.replace(config, worker_secret=secrets.token_hex(32))
    return run_server(config, cells=RayCells(config, secret_made=made))
