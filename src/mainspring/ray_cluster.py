"""Workers placed on a Ray cluster (``serve --ray [ADDRESS]``; ``pip install mainspring[ray]``).

The controller reserves each live node's devices (each GPU, else one CPU device per node) in a
placement group pinned to that node, one bundle per device, and starts one actor in each bundle;
the actor runs the ordinary ``mainspring worker`` as its child process, which connects back to the
controller over ZeroMQ TCP like any remote worker: Ray places and restarts workers, and stays off
the request path. The reservation outlives the actor, so a worker whose actor dies (someone killed
it, it crashed) is placed again in its own bundle after a backoff, and other Ray work on the
cluster cannot take its device in between. A node that leaves takes its reservation with it;
nodes that join the cluster get one on the next look (every ``period_s``). Every node needs the
model repository at the same path (shared storage, or the same files).
"""

from __future__ import annotations

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
from typing import Any

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


class WorkerActor:
    """A Ray actor that runs one ``mainspring worker`` process and lives as long as it does."""

    def run(self, arguments: Sequence[str], environment: dict[str, str]) -> int:
        # --parent-pid: the worker exits when this actor's process is gone (killed, node lost).
        command = [sys.executable, "-m", "mainspring.cli", "worker", *arguments, "--parent-pid", str(os.getpid())]
        return subprocess.Popen(command, env={**os.environ, **environment}).wait()


@dataclass
class _Placed:
    """One device's worker on the cluster: its actor and the reference its exit reports to."""

    actor: Any = None
    running: Any = None  # ObjectRef of WorkerActor.run
    retry_at: float = 0.0
    restarts: list[float] = field(default_factory=list)  # when it was lost, the last minute's


@dataclass(frozen=True)
class RayWorkers:
    """What each placed worker is started with."""

    controller: str  # tcp://HOST:PORT the workers connect to
    repo: str
    pool_mib: int = 0
    secret: str = ""  # the worker secret (it travels as an actor argument, inside the cluster)


class RayPlacer:
    """Keeps one worker per device of every live node of the Ray cluster at ``address``."""

    def __init__(self, address: str, workers: RayWorkers, period_s: float = 1.0) -> None:
        self.address = address
        self.workers = workers
        self.period_s = period_s
        self.placed: dict[tuple[str, str], _Placed] = {}  # (node id, device) -> its worker
        self.reserved: dict[str, tuple[Any, list[str]]] = {}  # node id -> (placement group, devices)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ray-placer", daemon=True)
        self._ray: Any = None
        self._actor_class: Any = None

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
            ray.init(include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES, **options)
        self._actor_class = ray.remote(max_restarts=0, max_concurrency=2)(WorkerActor)
        self._thread.start()

    def stop_placing(self) -> None:
        self._stop.set()

    def stop(self) -> None:
        """Stop placing, end every placed worker (its actor), and leave the cluster."""
        self._stop.set()
        if self._thread.ident is not None:  # it started (a start that failed did not get that far)
            self._thread.join(10)
        if self._ray is None or not self._ray.is_initialized():
            return
        for node in list(self.reserved):
            self._release(node)
        self._ray.shutdown()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile(time.monotonic())
            except Exception:  # Ray unreachable for a moment: look again next period
                log.exception("placing workers on Ray failed; trying again")
            self._stop.wait(self.period_s)

    def wanted(self) -> dict[str, list[str]]:
        """The devices of every live node, by node id: each GPU, else one CPU device."""
        devices = {}
        for node in self._ray.nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            gpus = int(resources.get("GPU", 0))
            names = [f"cuda:{i}" for i in range(gpus)] if gpus else (["cpu"] if resources.get("CPU", 0) >= 1 else [])
            if names:
                devices[node["NodeID"]] = names
        return devices

    def reconcile(self, now: float) -> None:
        ray = self._ray
        wanted = self.wanted()
        for node in [node for node in self.reserved if node not in wanted]:
            log.warning("Ray node %s left the cluster; its workers go with it", node[:8])
            self._release(node)
        for node, devices in wanted.items():
            if node not in self.reserved:
                self.reserved[node] = (self._reserve(node, devices), devices)
            for device in self.reserved[node][1]:
                placed = self.placed.setdefault((node, device), _Placed())
                if placed.running is not None:
                    done, _ = ray.wait([placed.running], timeout=0)
                    if not done:
                        continue  # running
                    self._lost((node, device), placed, now)
                if now >= placed.retry_at:
                    self._place((node, device), placed)

    def _reserve(self, node: str, devices: list[str]) -> Any:
        """A placement group holding one bundle per device of ``node``, on that node only."""
        placement = importlib.import_module("ray.util.placement_group")
        bundles = [{"GPU": 1.0} if device.startswith("cuda") else {"CPU": 1.0} for device in devices]
        on_node = [{NODE_LABEL: node}] * len(devices)
        return placement.placement_group(bundles, strategy="STRICT_PACK", bundle_label_selector=on_node)

    def _release(self, node: str) -> None:
        """End ``node``'s workers and give its reservation back."""
        group, devices = self.reserved.pop(node)
        for device in devices:
            placed = self.placed.pop((node, device), None)
            if placed is not None and placed.actor is not None:
                self._ray.kill(placed.actor)
        importlib.import_module("ray.util.placement_group").remove_placement_group(group)

    def _lost(self, key: tuple[str, str], placed: _Placed, now: float) -> None:
        placed.restarts = [t for t in placed.restarts if now - t < 60.0]
        first, longest = RESTART_BACKOFF_S
        delay = min(longest, first * 2 ** len(placed.restarts))
        placed.restarts.append(now)
        placed.retry_at = now + delay
        placed.actor = placed.running = None
        log.warning("worker for %s on node %s is gone; placing it again in %.1f s", key[1], key[0][:8], delay)

    def _place(self, key: tuple[str, str], placed: _Placed) -> None:
        in_bundle = importlib.import_module("ray.util.scheduling_strategies").PlacementGroupSchedulingStrategy
        node, device = key
        group, devices = self.reserved[node]
        gpu = device.startswith("cuda")
        workers = self.workers
        arguments = ["--controller", workers.controller, "--device", "cuda:0" if gpu else "cpu",
                     "--repo", workers.repo, "--name", f"ray-{node[:8]}-{device}"]  # fmt: skip
        if workers.pool_mib:
            arguments += ["--pool-mib", str(workers.pool_mib)]
        environment = {SECRET_ENV: workers.secret} if workers.secret else {}
        options: dict[str, Any] = {"scheduling_strategy": in_bundle(group, devices.index(device))}
        options.update({"num_gpus": 1, "num_cpus": 0} if gpu else {"num_cpus": 1})
        placed.actor = self._actor_class.options(**options).remote()
        placed.running = placed.actor.run.remote(arguments, environment)
        log.info("placed a worker for %s on Ray node %s", device, node[:8])
