"""The image's entrypoint, run as a container would run it, without Docker: the package built into a
wheel from what the Dockerfile copies, installed into a fresh virtual environment, started with the
Dockerfile's ENTRYPOINT, CMD and ENV, and judged by the Dockerfile's own HEALTHCHECK.

The dependencies come from this project's environment (a path file), not from an index: the test stays
offline and fast, and the package itself is imported from the new environment, not from the source tree."""

from __future__ import annotations

import importlib.metadata
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from mainspring.models.loading import export_zoo_model
from mainspring.models.repository import ModelRepository
from tests.deploy.dockerfiles import DOCKERFILES, ROOT, environment, exec_form, final_stage, healthcheck
from tests.serving.processes import alive, command_line, descendants, free_ports, http_call

CPU_IMAGE = DOCKERFILES[0]


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """/opt/mainspring as the Dockerfile lays it out: a virtual environment holding the built wheel."""
    root = tmp_path_factory.mktemp("image")
    context = root / "src-copy"  # COPY pyproject.toml README.md ./ and COPY src ./src, as the build stage does
    context.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, context / name)
    shutil.copytree(ROOT / "src", context / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    wheels = root / "wheels"
    # Built with this environment's setuptools when it is new enough for pyproject.toml (offline), else as
    # the Dockerfile's build does, in an isolated environment fetched from the index.
    offline = Version(importlib.metadata.version("setuptools")) >= Version("77")
    isolation = ["--no-build-isolation"] if offline else []
    subprocess.run(
        [*pip, "wheel", "--no-deps", *isolation, "--wheel-dir", str(wheels), str(context)], check=True, timeout=300
    )
    venv = root / "opt-mainspring"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    (wheel,) = wheels.glob("mainspring-*.whl")
    subprocess.run(
        [*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], check=True, timeout=300
    )
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()  # fmt: skip
    # The pinned dependencies, as requirements-run.txt put them in this project's environment.
    (Path(site) / "dependencies_from_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def container_env(venv: Path, home: Path, http_port: int, **settings: str) -> dict[str, str]:
    """The final stage's ENV, with the image's /opt/mainspring at ``venv``: a container's environment."""
    env = environment(final_stage(CPU_IMAGE))
    assert env["PATH"].startswith("/opt/mainspring/bin:")
    env["PATH"] = env["PATH"].replace("/opt/mainspring", str(venv)).replace("$PATH", "/usr/bin:/bin")
    # Loopback here, not the image's 0.0.0.0: a test opens no port beyond this machine.
    return {
        **env,
        "HOME": str(home),
        "MAINSPRING_HOST": "127.0.0.1",
        "MAINSPRING_HTTP_PORT": str(http_port),
        **settings,
    }


def health(venv: Path, env: dict[str, str]) -> int:
    """The Dockerfile's HEALTHCHECK command's exit status (0: healthy)."""
    return subprocess.run(healthcheck(final_stage(CPU_IMAGE)), env=env, capture_output=True, timeout=60).returncode


@pytest.fixture
def started(image_venv: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, str], Path]]:
    http_port, grpc_port, worker_port = free_ports(3)
    (tmp_path / "models").mkdir()
    repo = ModelRepository(tmp_path / "models")
    export_zoo_model(repo, "mlp")
    env = container_env(image_venv, tmp_path, http_port, MAINSPRING_GRPC_PORT=str(grpc_port),
                        MAINSPRING_WORKER_PORT=str(worker_port), MAINSPRING_REPO=str(repo.root),
                        MAINSPRING_DEVICES="cpu", MAINSPRING_POOL_MIB="64")  # fmt: skip
    command = [*exec_form(final_stage(CPU_IMAGE), "ENTRYPOINT"), *exec_form(final_stage(CPU_IMAGE), "CMD")]
    assert health(image_venv, env) != 0  # nothing listens yet
    log = tmp_path / "serve.log"
    with log.open("wb") as output:
        server = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT)
    try:
        yield server, env, log
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


@pytest.mark.slow
def test_the_entrypoint_serves_from_the_installed_wheel_and_the_health_check_passes_once_ready(
    image_venv: Path, started: tuple[subprocess.Popen[bytes], dict[str, str], Path]
) -> None:
    server, env, log = started
    url = f"http://127.0.0.1:{env['MAINSPRING_HTTP_PORT']}"
    deadline = time.monotonic() + 120  # generous for a busy machine; a passing run takes a few seconds
    while http_call(f"{url}/v2/health/ready")[0] != 200:
        assert server.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    assert health(image_venv, env) == 0
    assert http_call(f"{url}/v2/models/mlp/ready")[0] == 200
    workers = descendants(server.pid)
    assert workers, "serve started no worker process"
    # Every process of the server runs the image's environment's interpreter (its sys.prefix, and so the
    # installed package), not this project's.
    for pid in [server.pid, *workers]:
        assert command_line(pid)[0] == bytes(image_venv / "bin" / "python"), command_line(pid)
    located = subprocess.run(["python", "-c", "import mainspring; print(mainspring.__file__)"], env=env,
                             capture_output=True, text=True, check=True, timeout=60).stdout  # fmt: skip
    assert Path(located).is_relative_to(image_venv), located
    server.send_signal(signal.SIGTERM)  # what `docker stop` sends
    assert server.wait(60) == 0, log.read_text()
    assert not any(alive(pid) for pid in workers)
