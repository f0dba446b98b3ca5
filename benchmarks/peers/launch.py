"""Start and stop the servers that ``benchmarks/scenarios.py`` compares, each on free loopback ports.

Server names: ``mainspring`` (``mainspring serve``, clockwork policy, one CPU worker), and
``triton`` / ``ray`` with a loading mode: ``triton-expert``, ``triton-docs``, ``ray-expert``,
``ray-docs`` (see ``residency.py``). The peers run from their own environments under ``.peers/``
(``benchmarks/peers/install.sh``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.serving.processes import ServerProcess, free_port  # noqa: E402

SERVERS = ("mainspring", "triton-expert", "triton-docs", "ray-expert", "ray-docs")


class PeerProcess:
    """A peer server script run by its environment's interpreter; ready once it prints so and answers."""

    def __init__(self, name: str, repo: Path, log: Path, resident: int | None) -> None:
        peer, loading = name.split("-")
        python = ROOT / ".peers" / peer / "bin" / "python"
        if not python.exists():
            raise SystemExit(f"{name}: {python} is missing; run: bash benchmarks/peers/install.sh {peer}")
        self.peer = peer
        self.http_port = free_port()
        command = [str(python), str(ROOT / "benchmarks" / "peers" / f"{peer}_server.py"), "--repo", str(repo),
                   "--http-port", str(self.http_port), "--loading", loading]  # fmt: skip
        if peer == "triton":
            command += ["--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
        if resident is not None:
            command += ["--resident", str(resident)]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks" / "peers")}
        if peer == "triton":  # the Python backend's stub needs the interpreter's shared library
            libdir = subprocess.check_output(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"]
            )
            env["LD_LIBRARY_PATH"] = libdir.decode().strip()
        self.log = log
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(command, stdout=self._log_file, stderr=subprocess.STDOUT, env=env,
                                        cwd=ROOT / "benchmarks" / "peers", start_new_session=True)  # fmt: skip

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.peer} exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            if b"peer ready" in self.log.read_bytes():
                try:
                    with urllib.request.urlopen(f"http://{self.http}/v2/health/ready", timeout=2) as response:
                        if response.status == 200:
                            return
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.peer} not ready after {timeout_s} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.peer == "ray":  # Ray's own daemons outlive the driver
            subprocess.run([str(ROOT / ".peers" / "ray" / "bin" / "ray"), "stop", "--force"], capture_output=True)
        self._log_file.close()


def start(name: str, repo: Path, log: Path, pool_mib: int, resident: int | None) -> ServerProcess | PeerProcess:
    """Start server ``name`` on ``repo``: Mainspring with a ``pool_mib`` weight pool, a peer holding
    at most ``resident`` models (the same memory)."""
    if name == "mainspring":
        return ServerProcess(repo, log, "--pool-mib", str(pool_mib))
    if name not in SERVERS:
        raise SystemExit(f"unknown server {name!r}; choose from {', '.join(SERVERS)}")
    return PeerProcess(name, repo, log, resident)
