"""Workers, and with cells their controllers, placed on a Ray cluster (``serve --ray [ADDRESS]
[--cells N]``; ``pip install mainspring[ray]``).

The placer reserves each live node's devices (each GPU, else one CPU device per node) in a placement
group pinned to that node, one bundle per device, and starts one actor in each bundle; the actor runs
the ordinary ``mainspring worker`` as its child process, which connects back to its controller over
ZeroMQ TCP like any remote worker: Ray places and restarts processes, and stays off the request
path. With cells (``ray_cells.py``) a node's devices make one group per cell of at most 16, whose
first bundle holds the cell's controller (a ``CellActor``) beside its workers. The reservation
outlives the actors, so a process whose actor dies (someone killed it, it crashed) is placed again in
its own bundle after a backoff, and other Ray work on the cluster cannot take its device in between.
A node that leaves takes its reservations with it; nodes that join get theirs on the next look
(every ``period_s``). Every node needs the model repository at the same path (shared storage, or the
same files).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mainspring.transport.security import SECRET_ENV

log = logging.getLogger(__name__)

NODE_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id
RESTART_BACKOFF_S = (0.5, 30.0)  # first delay, longest delay (doubling per restart in the last minute)
# A local instance started for this server only places worker actors: nothing goes through its object
# store, whose default is 30% of memory (and warns where /dev/shm is smaller).
LOCAL_OBJECT_STORE_BYTES = 128 * 1024 * 1024


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """``OSError`` at once for a ``HOST:PORT`` nothing listens on: Ray itself tries for minutes."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or "://" in address:
        return  # "auto", a ray:// client address: Ray's own lookup
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
        pass


class ProcessActor:
    """A Ray actor that runs one mainspring process (``python -m ARGUMENTS``) and lives as long as it does."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None

    def run(self, arguments: Sequence[str], environment: dict[str, str]) -> int:
        command = [sys.executable, "-m", *arguments]
        self._process = subprocess.Popen(command, env={**os.environ, **environment})
        return self._process.wait()

    def stop(self, timeout_s: float) -> None:
        """SIGTERM its process (it drains) and wait up to ``timeout_s`` for it to end."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout_s)


class WorkerActor(ProcessActor):
    """Runs one ``mainspring worker``."""

    def run(self, arguments: Sequence[str], environment: dict[str, str]) -> int:
        # --parent-pid: the worker exits when this actor's process is gone (killed, node lost).
        return super().run(["mainspring.cli", "worker", *arguments, "--parent-pid", str(os.getpid())], environment)


class CellActor(ProcessActor):
    """Runs one cell's controller (``python -m mainspring.serving.local_cells SPEC``); it exits with this actor."""


@dataclass
class _Placed:
    """One process on the cluster (a device's worker, or a cell's controller): its actor and the
    reference its exit reports to."""

    actor: Any = None
    running: Any = None  # ObjectRef of ProcessActor.run
    retry_at: float = 0.0
    restarts: list[float] = field(default_factory=list)  # when it was lost, the last minute's


@dataclass
class _Reserved:
    """A placement group on one node: one bundle per device, after the cell's controller's (with cells)."""

    node: str
    address: str  # the node's IP
    devices: list[str]
    group: Any
    cell: int | None  # the cell it holds; None: workers of the one controller in the serving process
    placed: list[_Placed]  # in bundle order


@dataclass(frozen=True)
class RayWorkers:
    """What each placed worker is started with."""

    controller: str  # tcp://HOST:PORT the workers connect to (with cells: each cell's own, see ``CellHooks``)
    repo: str
    pool_mib: int = 0
    secret: str = ""  # the worker secret (it travels as an actor argument, inside the cluster)


class CellHooks(Protocol):
    """What the placer asks of the cells' front (``ray_cells.py``), from its own thread."""

    def new_cell(self, address: str, devices: int) -> int:
        """A cell's placement group is reserved on the node at ``address``: its index."""
        ...

    def cell_process(self, cell: int) -> tuple[list[str], dict[str, str]]:
        """``python -m`` arguments and environment of cell ``cell``'s controller."""
        ...

    def worker_endpoint(self, cell: int) -> str:
        """Where cell ``cell``'s workers connect."""
        ...

    def cell_gone(self, cell: int, why: str, for_good: bool) -> None:
        """Cell ``cell``'s controller exited (it is started again), or its node left (``for_good``)."""
        ...


class RayPlacer:
    """Keeps one worker per device of every live node of the Ray cluster at ``address``; with ``cells``,
    also a controller per cell of at most ``cell_devices`` of a node's devices, beside its workers."""

    def __init__(
        self,
        address: str,
        workers: RayWorkers,
        period_s: float = 1.0,
        cells: CellHooks | None = None,
        cell_devices: int = 16,
    ) -> None:
        self.address = address
        self.workers = workers
        self.period_s = period_s
        self.cells = cells
        self.cell_devices = cell_devices
        self.reserved: dict[tuple[str, int], _Reserved] = {}  # (node id, its n-th group) -> the group
        self._too_small: set[str] = set()  # nodes said to have no CPU for a cell's controller
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ray-placer", daemon=True)
        self._ray: Any = None
        self._actors: dict[str, Any] = {}  # actor class name -> its Ray remote class

    def start(self) -> None:
        try:
            ray: Any = importlib.import_module("ray")  # optional: only ``serve --ray`` needs it
        except ImportError:
            raise RuntimeError("serve --ray needs the ray package: pip install 'mainspring[ray]'") from None
        self._ray = ray
        options: dict[str, Any] = {"namespace": "mainspring", "logging_level": logging.WARNING, "log_to_driver": False}
        try:
            _check_reachable(self.address)
            ray.init(address=self.address, **options)
        except OSError as error:  # ConnectionError from Ray; refused, unresolvable or silent from the check
            if self.address != "auto":
                raise RuntimeError(
                    f"cannot reach the Ray cluster at {self.address!r} ({error}); is it running (`ray start --head` "
                    "there)? serve --ray with no address starts a local one when none runs here"
                ) from None
            # As ray.init() does when given no address: this server's own instance, stopped with it.
            log.info("no Ray cluster is running here: starting a local one, which stops with this server "
                     "(`ray start --head` keeps one across restarts)")  # fmt: skip
            self._start_local(ray, options)
        for actor in (WorkerActor, CellActor):
            self._actors[actor.__name__] = ray.remote(max_restarts=0, max_concurrency=2)(actor)
        self._thread.start()

    @staticmethod
    def _start_local(ray: Any, options: dict[str, Any]) -> None:
        """A local instance, as ``ray.init()`` starts one; once more if its raylet never registered. Ray forks
        its processes from this one, which runs other threads by then (the frontends, the hub), and the raylet's
        child rarely hangs before it runs (no raylet log is ever written): Ray then gives up after 30 s."""
        for attempt in (1, 2):
            try:
                ray.init(include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES, **options)
                return
            except Exception as error:
                if attempt == 2 or "timed out during startup" not in str(error):
                    raise
                log.warning("the local Ray instance did not start (%s); starting it again", error)
                ray.shutdown()

    def stop_placing(self) -> None:
        self._stop.set()

    def stop(self, drain_s: float = 5.0) -> None:
        """Stop placing; the cells' controllers drain (they answer what they hold); then end every placed
        process (its actor) and leave the cluster."""
        self._stop.set()
        if self._thread.ident is not None:  # it started (a start that failed did not get that far)
            self._thread.join(10)
        if self._ray is None or not self._ray.is_initialized():
            return
        controllers = [r.placed[0].actor for r in self.reserved.values() if r.cell is not None and r.placed[0].actor]
        if controllers:
            with contextlib.suppress(Exception):  # one that is gone already has nothing to drain
                self._ray.get([actor.stop.remote(drain_s + 10) for actor in controllers], timeout=drain_s + 15)
        for key in list(self.reserved):
            self._release(key)
        self._ray.shutdown()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile(time.monotonic())
            except Exception:  # Ray unreachable for a moment: look again next period
                log.exception("placing workers on Ray failed; trying again")
            self._stop.wait(self.period_s)

    def wanted(self) -> dict[str, tuple[str, list[str], float]]:
        """Every live node's IP, devices (each GPU, else one CPU device) and CPUs, by node id."""
        nodes = {}
        for node in self._ray.nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            gpus, cpus = int(resources.get("GPU", 0)), float(resources.get("CPU", 0))
            names = [f"cuda:{i}" for i in range(gpus)] if gpus else (["cpu"] if cpus >= 1 else [])
            if names:
                nodes[node["NodeID"]] = (node.get("NodeManagerAddress", ""), names, cpus)
        return nodes

    def _groups(self, node: str, devices: list[str], cpus: float) -> list[list[str]]:
        """The devices of each placement group on ``node``: all of them, or with cells one group per cell
        of at most ``cell_devices``, each needing a CPU for its controller beside its devices' own."""
        if self.cells is None:
            return [devices]
        size = self.cell_devices
        groups = [devices[i : i + size] for i in range(0, len(devices), size)]
        needed = len(groups) + sum(1 for d in devices if d == "cpu")
        if cpus < needed:
            if node not in self._too_small:
                self._too_small.add(node)
                log.warning("Ray node %s has %g CPU(s); its cells need %d (one per controller, one per CPU "
                            "device): it gets none", node[:8], cpus, needed)  # fmt: skip
            return []
        return groups

    def reconcile(self, now: float) -> None:
        ray = self._ray
        wanted = self.wanted()
        for key in [key for key in self.reserved if key[0] not in wanted]:
            log.warning("Ray node %s left the cluster; its workers go with it", key[0][:8])
            reserved = self._release(key)
            if reserved.cell is not None and self.cells is not None:
                self.cells.cell_gone(reserved.cell, "its Ray node left the cluster", for_good=True)
        for node, (address, devices, cpus) in wanted.items():
            for n, names in enumerate(self._groups(node, devices, cpus)):
                if (node, n) not in self.reserved:
                    self.reserved[(node, n)] = self._reserve(node, address, names)
                group = self.reserved[(node, n)]
                for slot, placed in enumerate(group.placed):
                    if placed.running is not None:
                        done, _ = ray.wait([placed.running], timeout=0)
                        if not done:
                            continue  # running
                        self._lost(group, slot, placed, now)
                    if now >= placed.retry_at:
                        self._place(group, slot, placed)

    def _reserve(self, node: str, address: str, devices: list[str]) -> _Reserved:
        """A placement group on ``node`` only: a bundle for the cell's controller (with cells), then one
        per device."""
        placement = importlib.import_module("ray.util.placement_group")
        bundles = [{"GPU": 1.0} if device.startswith("cuda") else {"CPU": 1.0} for device in devices]
        if self.cells is not None:
            bundles.insert(0, {"CPU": 1.0})
        on_node = [{NODE_LABEL: node}] * len(bundles)
        group = placement.placement_group(bundles, strategy="STRICT_PACK", bundle_label_selector=on_node)
        cell = None if self.cells is None else self.cells.new_cell(address, len(devices))  # once it is reserved
        return _Reserved(node, address, devices, group, cell, [_Placed() for _ in bundles])

    def _release(self, key: tuple[str, int]) -> _Reserved:
        """End a group's processes and give its reservation back."""
        reserved = self.reserved.pop(key)
        for placed in reserved.placed:
            if placed.actor is not None:
                self._ray.kill(placed.actor)
        importlib.import_module("ray.util.placement_group").remove_placement_group(reserved.group)
        return reserved

    def _lost(self, reserved: _Reserved, slot: int, placed: _Placed, now: float) -> None:
        placed.restarts = [t for t in placed.restarts if now - t < 60.0]
        first, longest = RESTART_BACKOFF_S
        delay = min(longest, first * 2 ** len(placed.restarts))
        placed.restarts.append(now)
        placed.retry_at = now + delay
        placed.actor = placed.running = None
        if reserved.cell is not None and slot == 0:
            log.warning("cell %d's controller on node %s is gone; starting it again in %.1f s", reserved.cell,
                        reserved.node[:8], delay)  # fmt: skip
            assert self.cells is not None
            self.cells.cell_gone(reserved.cell, "its controller exited", for_good=False)
        else:
            device = reserved.devices[slot - (reserved.cell is not None)]
            log.warning("worker for %s on node %s is gone; placing it again in %.1f s", device, reserved.node[:8],
                        delay)  # fmt: skip

    def _place(self, reserved: _Reserved, slot: int, placed: _Placed) -> None:
        in_bundle = importlib.import_module("ray.util.scheduling_strategies").PlacementGroupSchedulingStrategy
        options: dict[str, Any] = {"scheduling_strategy": in_bundle(reserved.group, slot)}
        if reserved.cell is not None and slot == 0:
            assert self.cells is not None
            arguments, environment = self.cells.cell_process(reserved.cell)
            placed.actor = self._actors["CellActor"].options(num_cpus=1, **options).remote()
            placed.running = placed.actor.run.remote(arguments, environment)
            log.info("placed cell %d's controller on Ray node %s", reserved.cell, reserved.node[:8])
            return
        device = reserved.devices[slot - (reserved.cell is not None)]
        gpu = device.startswith("cuda")
        workers = self.workers
        controller = workers.controller
        if reserved.cell is not None:
            assert self.cells is not None
            controller = self.cells.worker_endpoint(reserved.cell)
        cell = "" if reserved.cell is None else f"cell-{reserved.cell}-"
        arguments = ["--controller", controller, "--device", "cuda:0" if gpu else "cpu",
                     "--repo", workers.repo, "--name", f"ray-{cell}{reserved.node[:8]}-{device}"]  # fmt: skip
        if workers.pool_mib:
            arguments += ["--pool-mib", str(workers.pool_mib)]
        if reserved.cell is not None:  # its cell's controller may be restarted: join it again, weights kept
            arguments.append("--rejoin")
        environment = {SECRET_ENV: workers.secret} if workers.secret else {}
        options.update({"num_gpus": 1, "num_cpus": 0} if gpu else {"num_cpus": 1})
        placed.actor = self._actors["WorkerActor"].options(**options).remote()
        placed.running = placed.actor.run.remote(arguments, environment)
        log.info("placed a worker for %s on Ray node %s", device, reserved.node[:8])
