"""Real server and worker processes on loopback, as a user starts them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: held open together while picked, as ports picked one at a time
    can repeat (a server then fails to bind its second one)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


class ServerProcess:
    """``mainspring serve`` in a child process on free ports; its log goes to a file."""

    def __init__(
        self,
        repo: Path | None,  # None: no --repo (the default's)
        log: Path,
        *args: str,
        worker_port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.http_port, self.grpc_port, picked = free_ports(3)
        self.worker_port = worker_port or picked
        self.log = log
        home = Path((env or {}).get("HOME", Path.home()))
        self.repo = repo if repo is not None else home / ".mainspring" / "zoo"  # the default's place
        command = [
            sys.executable, "-m", "mainspring.cli", "serve", *(["--repo", str(repo)] if repo else []), "--devices",
            "cpu", "--pool-mib", "256", "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
            "--worker-port", str(self.worker_port), *args,
        ]  # fmt: skip
        environment = {**os.environ, "MAINSPRING_WORKER_TIMEOUT_S": "1.0", **(env or {})}
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(command, stdout=self._log_file, stderr=subprocess.STDOUT, env=environment)

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def worker_address(self) -> str:
        return f"tcp://127.0.0.1:{self.worker_port}"

    def wait_ready(self, timeout_s: float = 120.0, path: str = "/v2/health/ready") -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"http://{self.http}{path}", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout_s} s:\n{self.log.read_text()}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()
        return self.process.returncode


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux: from /proc)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children]


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (Linux: from /proc; 0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_worker(
    address: str, repo: Path, name: str, log: Path, pool_mib: int = 256, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "mainspring.cli", "worker", "--controller", address, "--repo", str(repo),
               "--pool-mib", str(pool_mib), "--name", name]  # fmt: skip
    with log.open("wb") as output:  # the child keeps its own descriptor
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def http_call(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """Status and body of a raw HTTP request (POST when there is a body); errors are returned, not raised:
    -1 when no connection could be made."""
    request = urllib.request.Request(
        url, data=body, headers=headers or {}, method="POST" if body is not None else "GET"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, ConnectionError) as error:
        return -1, str(error).encode()
