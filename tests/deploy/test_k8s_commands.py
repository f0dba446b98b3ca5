"""deploy/k8s's commands run here, as its pods would run them: the controller's args with the ConfigMap's
file and the Secret's values in its environment, a worker with the DaemonSet's args. The cluster's names
are swapped for this machine's (loopback and free ports, the CPU for cuda:0, a temporary repository); the
controller's probes and the Secret's effect are asked of the running processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mainspring.models.loading import export_zoo_model
from mainspring.models.repository import ModelRepository
from tests.deploy.manifests import Resource, container, container_environment, expand, one, render
from tests.deploy.test_kubernetes import FILLED, filled
from tests.serving.processes import free_ports, http_call


def _swapped(args: list[str], swaps: dict[str, str]) -> list[str]:
    return [swaps.get(arg, arg) for arg in args]


def _wait_for(condition: object, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0) -> None:
    """Until ``condition()`` holds; generous for a busy machine, as short as the processes allow."""
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in started:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_a_worker_started_as_the_daemonset_starts_it_makes_the_controller_ready(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    resources: list[Resource] = filled(render())
    controller, worker = (
        one(resources, "Deployment", "mainspring-controller"),
        one(resources, "DaemonSet", "mainspring-worker"),
    )
    http_port, grpc_port, worker_port = free_ports(3)
    (tmp_path / "models").mkdir()
    repo = ModelRepository(tmp_path / "models")
    export_zoo_model(repo, "mlp")
    config_file = tmp_path / "serve.toml"
    config_file.write_text(one(resources, "ConfigMap", "mainspring-serve")["data"]["serve.toml"])
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    # The controller: flags after the pod's args override the file's ports and repository for this machine.
    main = container(controller)
    env = {**base, **container_environment(controller["spec"]["template"]["spec"], main["env"], resources),
           "MAINSPRING_HOST": "127.0.0.1"}  # fmt: skip
    args = _swapped(expand(main["args"], env), {"/etc/mainspring/serve.toml": str(config_file)})
    overrides = ["--http-port", str(http_port), "--grpc-port", str(grpc_port), "--worker-port", str(worker_port),
                 "--repo", str(repo.root)]  # fmt: skip
    serve_log = tmp_path / "controller.log"
    with serve_log.open("wb") as log:
        processes.append(subprocess.Popen([sys.executable, "-m", "mainspring.cli", *args, *overrides], env=env,
                                          stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
    server = processes[0]
    probes = {kind: main[kind]["httpGet"]["path"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    url = f"http://127.0.0.1:{http_port}"
    _wait_for(lambda: http_call(url + probes["startupProbe"])[0] == 200, server, serve_log)
    assert http_call(url + probes["livenessProbe"])[0] == 200
    assert http_call(url + probes["readinessProbe"])[0] == 503  # no worker yet: out of the client Service
    # The worker, as the DaemonSet's pod starts it, its secret from the same Secret.
    worker_main = container(worker)
    worker_env = {**base, **container_environment(worker["spec"]["template"]["spec"], worker_main["env"], resources)}
    here = {
        "tcp://mainspring-workers:8002": f"tcp://127.0.0.1:{worker_port}",
        "cuda:0": "cpu",
        "/models": str(repo.root),
    }
    worker_args = _swapped(expand(worker_main["args"], worker_env), here)
    worker_log = tmp_path / "worker.log"
    with worker_log.open("wb") as log:
        processes.append(subprocess.Popen([sys.executable, "-m", "mainspring.cli", *worker_args, "--pool-mib", "64"],
                                          env=worker_env, stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
    _wait_for(lambda: http_call(url + probes["readinessProbe"])[0] == 200, server, serve_log)
    assert http_call(f"{url}/v2/models/mlp/ready")[0] == 200
    # The Secret's auth_token guards the repository API (the probes above needed none).
    assert http_call(f"{url}/v2/repository/index", b"{}")[0] == 401
    bearer = {"Authorization": f"Bearer {FILLED['auth_token']}"}
    assert http_call(f"{url}/v2/repository/index", b"{}", bearer)[0] == 200
    server.send_signal(signal.SIGTERM)  # what Kubernetes sends at a pod's stop
    assert server.wait(60) == 0, serve_log.read_text()
