"""Real server and worker processes on loopback, as a user starts them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
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


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (started by any of its threads, and theirs in turn; Linux: from /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue  # the thread ended
        for child in children:
            found += [child, *descendants(child)]
    return found


def command_line(pid: int) -> list[bytes]:
    """The arguments process ``pid`` runs with ([] once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return text.rstrip(b"\0").split(b"\0") if text else []


def alive(pid: int) -> bool:
    return bool(command_line(pid))  # a zombie has no command line left


def _listed_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def workers_on(ports: Iterable[int]) -> dict[int, int]:
    """The ``mainspring worker`` processes whose controller is on one of ``ports`` (the test's own, so no
    other server's), each with the process it watches (``--parent-pid``: on Ray, its actor)."""
    endings = tuple(f":{port}".encode() for port in ports)
    found = {}
    for pid in _listed_pids():
        argv = command_line(pid)
        if b"--controller" in argv[:-1] and argv[argv.index(b"--controller") + 1].endswith(endings):
            parent = argv[argv.index(b"--parent-pid") + 1] if b"--parent-pid" in argv[:-1] else b"0"
            found[pid] = int(parent)
    return found


def cells_on(ports: Iterable[int]) -> dict[int, int]:
    """The cell controller processes (``mainspring.serving.local_cells``) whose frontends' channel is on one of
    ``ports`` (the test's own), by cell index."""
    endings = [f':{port}","signal_endpoint":'.encode() for port in ports]
    found = {}
    for pid in _listed_pids():
        argv = command_line(pid)
        if b"mainspring.serving.local_cells" in argv[:-1] and any(end in argv[-1] for end in endings):
            found[json.loads(argv[-1])["index"]] = pid
    return found


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
