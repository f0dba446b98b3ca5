"""Workers placed on a Ray cluster (``serve --ray [ADDRESS]``; ``pip install mainspring[ray]``).

The controller asks Ray for one actor per device of every live node (each GPU, else one CPU
device per node), pinned to its node, and each actor runs the ordinary ``mainspring worker`` as
its child process, which connects back to the controller over ZeroMQ TCP like any remote worker:
Ray places and restarts workers, and stays off the request path. A worker whose actor dies (the
node went away, someone killed it) is placed again after a backoff; nodes that join the cluster
get workers on the next look (every ``period_s``). Every node needs the model repository at the
same path (shared storage, or the same files).
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mainspring.transport.security import SECRET_ENV

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.5, 30.0)  # first delay, longest delay (doubling per restart in the last minute)


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
        ray.init(address=self.address, namespace="mainspring", logging_level=logging.WARNING, log_to_driver=False)
        self._actor_class = ray.remote(max_restarts=0, max_concurrency=2)(WorkerActor)
        self._thread.start()

    def stop_placing(self) -> None:
        self._stop.set()

    def stop(self) -> None:
        """Stop placing, end every placed worker (its actor), and leave the cluster."""
        self._stop.set()
        self._thread.join(10)
        for placed in self.placed.values():
            if placed.actor is not None:
                self._ray.kill(placed.actor)
        self._ray.shutdown()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile(time.monotonic())
            except Exception:  # Ray unreachable for a moment: look again next period
                log.exception("placing workers on Ray failed; trying again")
            self._stop.wait(self.period_s)

    def wanted(self) -> list[tuple[str, str]]:
        """(node id, device) for every device of every live node: each GPU, else one CPU device."""
        devices = []
        for node in self._ray.nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            gpus = int(resources.get("GPU", 0))
            names = [f"cuda:{i}" for i in range(gpus)] if gpus else (["cpu"] if resources.get("CPU", 0) >= 1 else [])
            devices += [(node["NodeID"], name) for name in names]
        return devices

    def reconcile(self, now: float) -> None:
        ray = self._ray
        for key in self.wanted():
            placed = self.placed.setdefault(key, _Placed())
            if placed.running is not None:
                done, _ = ray.wait([placed.running], timeout=0)
                if not done:
                    continue  # running
                self._lost(key, placed, now)
            if now >= placed.retry_at:
                self._place(key, placed)

    def _lost(self, key: tuple[str, str], placed: _Placed, now: float) -> None:
        placed.restarts = [t for t in placed.restarts if now - t < 60.0]
        first, longest = RESTART_BACKOFF_S
        delay = min(longest, first * 2 ** len(placed.restarts))
        placed.restarts.append(now)
        placed.retry_at = now + delay
        placed.actor = placed.running = None
        log.warning("worker for %s on node %s is gone; placing it again in %.1f s", key[1], key[0][:8], delay)

    def _place(self, key: tuple[str, str], placed: _Placed) -> None:
        affinity = importlib.import_module("ray.util.scheduling_strategies").NodeAffinitySchedulingStrategy
        node, device = key
        gpu = device.startswith("cuda")
        workers = self.workers
        arguments = ["--controller", workers.controller, "--device", "cuda:0" if gpu else "cpu",
                     "--repo", workers.repo, "--name", f"ray-{node[:8]}-{device}"]  # fmt: skip
        if workers.pool_mib:
            arguments += ["--pool-mib", str(workers.pool_mib)]
        environment = {SECRET_ENV: workers.secret} if workers.secret else {}
        options: dict[str, Any] = {"scheduling_strategy": affinity(node, soft=False)}
        options.update({"num_gpus": 1, "num_cpus": 0} if gpu else {"num_cpus": 1})
        placed.actor = self._actor_class.options(**options).remote()
        placed.running = placed.actor.run.remote(arguments, environment)
        log.info("placed a worker for %s on Ray node %s", device, node[:8])
