"""``mainspring serve`` as the README runs it: settings from file, environment and flags; the built-in zoo on
first start; a clean shutdown on SIGTERM that answers what is in flight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mainspring.models.repository import ModelRepository
from mainspring.serving.config import ServeConfig, load_config
from tests.serving.processes import free_port, http_call


def test_settings_come_from_file_then_environment_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "serve.toml"
    file.write_text('[serve]\nhttp_port = 9000\npolicy = "triton"\nslo_ms = 50\n')
    env = {"MAINSPRING_HTTP_PORT": "9100", "MAINSPRING_GRPC_PORT": "9101", "MAINSPRING_PIN_CPU_WORKERS": "no"}
    config = load_config(file, env, {"grpc_port": 9201, "repo": None, "pin_cpu_workers": None})
    assert config == ServeConfig(http_port=9100, grpc_port=9201, policy="triton", slo_ms=50.0)
    assert load_config(None, {"MAINSPRING_PIN_CPU_WORKERS": "on"}, {}).pin_cpu_workers
    assert load_config(None, {}, {}) == ServeConfig()


def test_clockwork_settings_come_from_its_table_then_environment_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "serve.toml"
    file.write_text("[serve]\nslo_ms = 50\n[clockwork]\nestimate_percentile = 95\nestimate_window = 20\n")
    env = {"MAINSPRING_CLOCKWORK_ESTIMATE_WINDOW": "30", "MAINSPRING_CLOCKWORK_SPILL_AFTER": "none"}
    config = load_config(file, env, {}, ["estimate_percentile=90", "lookahead=off"])
    assert config.slo_ms == 50.0
    expected = {"estimate_percentile": 90.0, "estimate_window": 30, "spill_after": None, "lookahead": False}
    assert config.clockwork == expected
    top_level = tmp_path / "top.toml"  # no [serve] table: top-level keys, and [clockwork] beside them
    top_level.write_text("slo_ms = 40\n[clockwork]\nhorizon_ms = 2\n")
    assert load_config(top_level, {}, {}).clockwork == {"horizon_ms": 2.0}


@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        ({"MAINSPRING_CLOCKWORK_COLOUR": "red"}, [], "MAINSPRING_CLOCKWORK_COLOUR: unknown setting 'colour'"),
        ({"MAINSPRING_CLOCKWORK_ESTIMATE_WINDOW": "2.5"}, [], "estimate_window='2.5' is not an int"),
        ({}, ["lookahead=maybe"], "--clockwork lookahead=maybe: setting lookahead='maybe' is not a bool"),
        ({}, ["estimate_percentile"], "--clockwork 'estimate_percentile': expected KEY=VALUE"),
        ({}, ["min_share=3"], "min_share=3.0 must lie in (0, 1]"),
        ({}, ["deadline_margin_ms=2"], "is not set here: the server's deadline_margin_ms"),
        ({"MAINSPRING_POLICY": "triton"}, ["lookahead=off"], "apply to policy clockwork, not 'triton'"),
    ],
)
def test_bad_clockwork_settings_name_the_setting_and_where(env: dict[str, str], flags: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_config(None, env, {}, flags)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MAINSPRING_HTTP_PORT": "eighty"}, "http_port='eighty' is not an int"),
        ({"MAINSPRING_POLICY": "fifo"}, "policy='fifo' is not one of"),
        ({"MAINSPRING_COLOUR": "red"}, "environment variable MAINSPRING_COLOUR: unknown setting 'colour'"),
        ({"MAINSPRING_WORKERS": "ray"}, "workers='ray' must be 'local' or 'tcp'"),
        ({"MAINSPRING_PIN_CPU_WORKERS": "maybe"}, "pin_cpu_workers='maybe' is not a bool"),
        ({"MAINSPRING_MAX_LOOP_LAG_MS": "-5"}, "max_loop_lag_ms=-5.0 must not be negative"),
        ({"MAINSPRING_REPOSITORY_POLL_S": "-1"}, "repository_poll_s=-1.0 must not be negative (0: no polling)"),
        ({"MAINSPRING_REPOSITORY_POLL_S": "nan"}, "repository_poll_s=nan must be a finite number"),
        ({"MAINSPRING_DRAIN_S": "inf"}, "drain_s=inf must be a finite number"),
        ({"MAINSPRING_EVENT_LOOP": "trio"}, "event_loop='trio' must be 'asyncio' or 'uvloop'"),
        ({"MAINSPRING_SLO_MS": "1e12"}, "slo_ms must be at most 86400000 (one day), got 1000000000000.0"),
        ({"MAINSPRING_POOL_MIB": "-1"}, "pool_mib=-1 must hold at least one 16 MiB page (0: the runtime's default)"),
        ({"MAINSPRING_POOL_MIB": "8"}, "pool_mib=8 must hold at least one 16 MiB page"),
        ({"MAINSPRING_DEVICES": " , "}, "devices=' , ' names no device"),
    ],
)
def test_bad_settings_name_the_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, env, {})


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('devices = ["cpu", 3]', "setting devices=['cpu', 3] is not a string"),
        ("devices = []", "setting devices=[] is not a string"),
        ("repo = 5", "setting repo=5 is not a string"),
        ("[serve.policy]\nname = 'triton'", "setting policy={'name': 'triton'} is not a string"),
        ('auth_token = ["s3cret"]', "setting auth_token=(hidden) is not a string"),  # never in a log
    ],
)
def test_a_config_file_value_of_the_wrong_kind_is_refused(tmp_path: Path, toml: str, message: str) -> None:
    file = tmp_path / "serve.toml"
    file.write_text(f"[serve]\n{toml}\n")
    with pytest.raises(ValueError, match="is not a string") as refused:
        load_config(file, {}, {})
    assert str(refused.value) == f"config file {file}: {message}"
    assert "s3cret" not in str(refused.value)


def test_a_config_file_may_list_the_devices(tmp_path: Path) -> None:
    file = tmp_path / "serve.toml"
    file.write_text('[serve]\ndevices = ["cpu", "cpu"]\n')
    assert load_config(file, {}, {}).device_list() == ["cpu", "cpu"]


@pytest.mark.slow
def test_first_start_builds_the_zoo_and_sigterm_answers_what_is_in_flight(tmp_path: Path) -> None:
    http_port = free_port()
    env = {**os.environ, "HOME": str(tmp_path), "MAINSPRING_HTTP_PORT": str(http_port),
           "MAINSPRING_GRPC_PORT": str(free_port()), "MAINSPRING_WORKER_PORT": str(free_port()),
           "MAINSPRING_POOL_MIB": "512", "MAINSPRING_SLO_MS": "3000"}  # fmt: skip
    log = tmp_path / "serve.log"
    with log.open("wb") as output:
        server = subprocess.Popen([sys.executable, "-m", "mainspring.cli", "serve"], stdout=output,
                                  stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{http_port}"
        for _ in range(1800):
            if server.poll() is not None or http_call(f"{url}/v2/health/ready")[0] == 200:
                break
            threading.Event().wait(0.1)
        assert server.poll() is None, log.read_text()
        assert sorted(m["name"] for m in json.loads(http_call(f"{url}/v2/repository/index", b"")[1])) == [
            "bert_tiny", "mlp", "mobilenetv2", "resnet18"]  # fmt: skip
        assert (tmp_path / ".mainspring" / "zoo" / "resnet18" / "1" / "model.pt2").is_file()
        data = [0.1] * (3 * 64 * 64)
        body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 64, 64], "data": data}]})
        statuses: list[int] = []

        def client() -> None:
            for _ in range(20):
                statuses.append(http_call(f"{url}/v2/models/resnet18/infer", body.encode())[0])

        threads = [threading.Thread(target=client) for _ in range(4)]
        for thread in threads:
            thread.start()
        threading.Event().wait(0.5)
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0, log.read_text()
        for thread in threads:
            thread.join(60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert 200 in statuses
    assert set(statuses) <= {200, 503, -1}, statuses  # served, refused while draining, or not accepted (-1)
    text = log.read_text()
    assert "first start: writing the built-in zoo" in text and "stopped" in text and "Traceback" not in text


@pytest.mark.slow
def test_the_uvloop_event_loop_serves_when_chosen(small_zoo: ModelRepository, tmp_path: Path) -> None:
    import shutil

    from tests.serving.processes import ServerProcess
    from tests.serving.test_worker_loss import body

    shutil.copytree(small_zoo.root, tmp_path / "repo")
    server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", "--slo-ms", "30000",
                           env={"MAINSPRING_EVENT_LOOP": "uvloop"})  # fmt: skip
    try:
        server.wait_ready()
        for model in ("mlp", "bert_tiny"):
            status, reply = http_call(f"http://{server.http}/v2/models/{model}/infer", body(model))
            assert status == 200, reply
        assert "event loop: uvloop" in (tmp_path / "server.log").read_text()
    finally:
        assert server.stop() == 0, (tmp_path / "server.log").read_text()


def _workers_of(pid: int) -> list[str]:
    """The worker processes still alive that ``pid`` started (they carry ``--parent-pid PID``)."""
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if b"--parent-pid" in command and command[command.index(b"--parent-pid") + 1] == str(pid).encode():
            alive.append(entry.name)
    return alive


@pytest.mark.parametrize(
    ("device", "message"),
    [("bogus", "device 'bogus' is not a device name (cpu, cuda or cuda:N)"), ("cuda:7", "is not on this machine")],
)
def test_a_device_that_cannot_be_served_stops_the_start_with_its_reason(
    small_zoo: ModelRepository, tmp_path: Path, device: str, message: str
) -> None:
    from tests.serving.processes import ServerProcess

    server = ServerProcess(small_zoo.root, tmp_path / "server.log", "--devices", device)
    server.process.wait(60)
    assert server.stop() == 1
    text = (tmp_path / "server.log").read_text()
    assert f"cannot serve on {device!r}: " in text and message in text, text
    assert "Traceback" not in text and "never awaited" not in text, text


def test_a_stop_while_the_workers_load_ends_the_server_at_once_and_cleanly(
    small_zoo: ModelRepository, tmp_path: Path
) -> None:
    from tests.serving.processes import ServerProcess

    log = tmp_path / "server.log"
    server = ServerProcess(small_zoo.root, log)
    try:
        for _ in range(600):  # the ports are up and the worker is starting (loading takes seconds)
            if "HTTP on" in log.read_text() or server.process.poll() is not None:
                break
            threading.Event().wait(0.05)
        server.process.send_signal(signal.SIGTERM)  # to the server alone: its worker is told nothing
        server.process.wait(20)
    finally:
        assert server.stop() == 0, log.read_text()
    text = log.read_text()
    assert "stop requested during start-up" in text and "stopped" in text, text
    assert "Traceback" not in text and "never awaited" not in text, text
    assert _workers_of(server.process.pid) == []


@pytest.mark.parametrize(
    ("taken", "frontends", "message"),
    [
        ("grpc", "1", "cannot listen for gRPC on 127.0.0.1:{port}"),
        ("grpc", "2", "cannot listen for gRPC on 127.0.0.1:{port}: Address already in use"),
        ("http", "2", "cannot listen for HTTP on 127.0.0.1:{port}: Address already in use"),
        ("worker", "1", "cannot listen for workers on tcp://127.0.0.1:{port}: Address already in use"),
    ],
)
def test_a_port_in_use_stops_the_start_even_where_its_holder_shares_ports(
    small_zoo: ModelRepository, tmp_path: Path, taken: str, frontends: str, message: str
) -> None:
    """gRPC and the shared frontends bind with SO_REUSEPORT: a second server must not quietly split the
    calls with whatever holds the port (here a listener that shares, as another Mainspring would)."""
    import socket

    from tests.serving.processes import ServerProcess

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    port_flag = {"grpc": "--grpc-port", "http": "--http-port", "worker": "--worker-port"}[taken]
    try:
        opened = ("--allow-open-workers",) if taken == "worker" else ()  # else local workers use no TCP port
        server = ServerProcess(small_zoo.root, tmp_path / "server.log", "--frontends", frontends, port_flag, str(port),
                               *opened)  # fmt: skip
        try:
            server.process.wait(60)
        finally:
            returncode = server.stop()
    finally:
        holder.close()
    text = (tmp_path / "server.log").read_text()
    assert returncode == 1 and message.format(port=port) in text, text
    assert "Traceback" not in text, text


def test_cells_are_sized_to_the_devices_and_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default a cell per 16 local devices, at most one per two cores; 1 (one controller, as before)
    for up to 16 devices, for remote workers and on Ray; a number given is kept."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert ServeConfig(devices="cpu").cell_count() == 1
    assert ServeConfig(devices=",".join(["cuda:0"] * 16)).cell_count() == 1
    assert ServeConfig(devices=",".join(["cuda:0"] * 40)).cell_count() == 3
    assert ServeConfig(devices=",".join(["cuda:0"] * 200)).cell_count() == 4  # the cores bound it
    assert ServeConfig(workers="tcp", allow_open_workers=True).cell_count() == 1
    assert ServeConfig(cells=2, devices="cpu,cpu").cell_count() == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert ServeConfig(devices=",".join(["cuda:0"] * 40)).cell_count() == 1
    with pytest.raises(ValueError, match="cells=-1 must not be negative"):
        ServeConfig(cells=-1)
