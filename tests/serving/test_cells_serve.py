"""``serve --cells 2``: two controller processes behind one server, each with its own emulated devices
(``worker --emulate`` joining on worker_port + i). Clients see one server: one port, one repository API,
one /metrics with a ``cell`` label); repository changes made while a cell restarts are kept; start-up
stops at SIGTERM. Real processes on loopback."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serving.processes import ServerProcess, child_pids, http_call
from tests.waiting import wait_for


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports on loopback."""
    for _ in range(200):
        base = random.randrange(20_000, 60_000)
        probes = [socket.socket() for _ in range(count)]
        try:
            for offset, probe in enumerate(probes):
                probe.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError("no consecutive free ports")


SECRET = {"MAINSPRING_WORKER_SECRET": "cells-test-secret"}  # remote workers prove who they are


def emulated_worker(address: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "mainspring.cli", "worker", "--controller", address, "--emulate", "--count", "1",
               "--models", "6", "--name", name]  # fmt: skip
    with log.open("wb") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **SECRET})


def samples(server: ServerProcess, name: str) -> list[tuple[dict[str, str], float]]:
    _, text = http_call(f"http://{server.http}/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    family = families.get(name)
    return [] if family is None else [(s.labels, s.value) for s in family.samples if not s.name.endswith("_created")]


def infer(server: ServerProcess, model: str, i: int) -> tuple[int, list[float], object]:
    values = [random.Random(i).random() for _ in range(4)]
    body = {"id": str(i), "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": values}]}
    status, raw = http_call(f"http://{server.http}/v2/models/{model}/infer", json.dumps(body).encode())
    answer = json.loads(raw) if raw.startswith(b"{") else raw
    return status, values, answer["outputs"][0]["data"] if status == 200 else answer


class TwoCells:
    def __init__(self, tmp_path: Path, *args: str) -> None:
        (tmp_path / "repo").mkdir()
        self.base = consecutive_free_ports(2)
        self.server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", "--workers", "tcp", "--cells", "2",
                                    "--frontends", "1", *args, worker_port=self.base, env=SECRET)  # fmt: skip
        self.workers = [
            emulated_worker(f"tcp://127.0.0.1:{self.base + i}", f"emulated-{i}", tmp_path / f"worker-{i}.log")
            for i in range(2)
        ]
        self.server.wait_ready()
        if "--frontends" in args:  # the frontend processes too: what they see counts from the start
            count = int(args[args.index("--frontends") + 1])
            wait_for(lambda: self.server.log.read_text().count(") serving HTTP on") == count - 1, timeout_s=60)
        _, index = http_call(f"http://{self.server.http}/v2/repository/index", b"{}")
        self.models = sorted(entry["name"] for entry in json.loads(index))

    def cell_pid(self, index: int) -> int:
        for pid in child_pids(self.server.process.pid):
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"serving.local_cells" in command and f'"index":{index},'.encode() in command:
                return pid
        raise AssertionError(f"no process for cell {index}")

    def close(self) -> None:
        for worker in self.workers:
            worker.terminate()
            worker.wait(30)
        assert self.server.stop() == 0, self.server.log.read_text()


def test_two_cells_answer_every_request_once_and_look_like_one_server(tmp_path: Path) -> None:
    cells = TwoCells(tmp_path, "--slo-ms", "2000")
    server, models = cells.server, cells.models
    try:
        assert len(models) == 6
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: infer(server, models[i % 6], i), range(300)))
        assert all(status == 200 for status, _, _ in answers), [a for a in answers if a[0] != 200][:3]
        for _, sent, echoed in answers:  # each its own answer: the emulated model echoes its input
            assert echoed == pytest.approx(sent, rel=1e-6)
        served = [(labels, value) for labels, value in samples(server, "mainspring_requests")
                  if labels.get("outcome") == "success"]  # fmt: skip
        assert sum(value for _, value in served) == 300
        assert {labels["cell"] for labels, _ in samples(server, "mainspring_devices")} == {"0", "1"}
        assert sum(value for _, value in samples(server, "mainspring_devices")) == 2
        _, raw = http_call(f"http://{server.http}/v2/models/stats")
        stats = json.loads(raw)["model_stats"]
        assert sum(s["inference_stats"]["success"]["count"] for s in stats) == 300  # summed over the cells

        # one repository API: an unload reaches both cells; the workers' model (no file here) loads back
        model = models[0]
        assert repository(server, model, "unload") == 200
        assert all(infer(server, model, i)[0] == 404 for i in range(6))  # whichever cell it would go to
        assert all(infer(server, models[1], i)[0] == 200 for i in range(6))
        _, index = http_call(f"http://{server.http}/v2/repository/index", b"{}")
        ready = {entry["name"] for entry in json.loads(index) if entry.get("state") == "READY"}
        assert model not in ready and models[1] in ready
        assert repository(server, model, "load") == 200
        back = [infer(server, model, i) for i in range(6)]
        assert all(status == 200 for status, _, _ in back), back
        assert {labels["cell"]: v for labels, v in samples(server, "mainspring_models")} == {"0": 6, "1": 6}
    finally:
        cells.close()


def repository(server: ServerProcess, model: str, change: str) -> int:
    return http_call(f"http://{server.http}/v2/repository/models/{model}/{change}", b"{}")[0]


@pytest.mark.parametrize("frontends", ["1", "2"])  # 2: a frontend process's port too, which only waits
def test_changes_while_a_cell_restarts_reach_it_on_its_return_and_ready_agrees_with_infer(
    tmp_path: Path, frontends: str
) -> None:
    """Cell 0's controller is killed and a model unloaded at once: 200, from cell 1 alone. Cell 0 comes
    back with workers that still hold the model; it must not serve it again. At every moment until after
    its return, /ready and infer agree: the unloaded model is neither ready nor served, the other both.
    Then cell 0 is killed again and the model loaded back: on its return cell 0 loads it too."""
    cells = TwoCells(tmp_path, "--slo-ms", "2000", "--frontends", frontends)
    server, (model, kept) = cells.server, cells.models[:2]
    seen: list[tuple[str, int, int]] = []  # (model, /ready status, infer status)

    def in_line_after(restarts: int) -> bool:
        for name in (model, kept):
            ready, _ = http_call(f"http://{server.http}/v2/models/{name}/ready")
            seen.append((name, ready, infer(server, name, len(seen))[0]))
        return server.log.read_text().count("cell 0 serves what the other cells serve") >= restarts

    def models_by_cell() -> dict[str, float]:
        return {labels["cell"]: v for labels, v in samples(server, "mainspring_models")}

    try:
        os.kill(cells.cell_pid(0), signal.SIGKILL)
        assert repository(server, model, "unload") == 200
        wait_for(lambda: in_line_after(1), timeout_s=60, every_s=0.02)  # until cell 0 is back and in line
        for _ in range(10):
            in_line_after(1)
        unloaded, seen[:] = list(seen), []
        assert models_by_cell() == {"0": 5, "1": 5}

        os.kill(cells.cell_pid(0), signal.SIGKILL)
        assert repository(server, model, "load") == 200
        wait_for(lambda: in_line_after(2), timeout_s=60, every_s=0.02)
        assert models_by_cell() == {"0": 6, "1": 6}
        text = server.log.read_text()
        for change in ("unload", "load"):
            assert f"cell 0: the {change} of {model} made while it was down is done there too" in text, text
    finally:
        cells.close()
    assert len(unloaded) > 20 and len(seen) > 4
    assert all(ready != 200 and status == 404 for name, ready, status in unloaded if name == model), unloaded
    ready_ones = [(ready, status) for name, ready, status in unloaded if name == kept] + [(r, s) for _, r, s in seen]
    assert all(ready == 200 and status in (200, 503) for ready, status in ready_ones), ready_ones
    assert sum(status == 200 for _, status in ready_ones) >= 0.9 * len(ready_ones)  # 503: a call the kill caught


def test_sigterm_while_the_cells_wait_for_devices_stops_the_server_at_once(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", "--workers", "tcp", "--cells", "2",
                           "--frontends", "1", worker_port=consecutive_free_ports(2), env=SECRET)  # fmt: skip
    try:
        wait_for(lambda: "to have a device" in server.log.read_text(), timeout_s=60)  # no worker joins
        cell_pids = child_pids(server.process.pid)
        sent = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(60)
        took = time.monotonic() - sent
    finally:
        server.stop()
    text = server.log.read_text()
    assert code == 0 and took < 15, (took, text)
    assert "stop requested during start-up" in text and "no device" not in text and "Traceback" not in text, text
    assert cell_pids and not [pid for pid in cell_pids if Path(f"/proc/{pid}").exists()]  # the cells ended too


def test_cells_without_devices_at_the_join_timeout_say_which_and_where_their_workers_join(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    """No worker joins: the start ends at ``join_timeout_s`` with one line naming the cells and their
    workers' ports (a machine too slow to start the cells by then gets a line naming them too)."""
    base, env = consecutive_free_ports(2), {**SECRET, "MAINSPRING_JOIN_TIMEOUT_S": "10"}
    server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", "--workers", "tcp", "--cells", "2",
                           "--frontends", "1", worker_port=base, env=env)  # fmt: skip
    assert server.process.wait(60) == 1
    server.stop()
    errors = [line for line in server.log.read_text().splitlines() if " ERROR " in line]
    no_device = f"cells [0, 1] have no device after 10 s (their workers join on ports [{base}, {base + 1}])"
    assert len(errors) == 1 and (no_device in errors[0] or "did not answer within 10 s" in errors[0]), errors
    assert "Traceback" not in server.log.read_text()


def test_two_cells_on_one_device_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", "--cells", "2")  # on --devices cpu
    assert server.process.wait(60) == 2
    server.stop()
    lines = [line for line in server.log.read_text().splitlines() if line.strip()]
    assert len(lines) == 1 and "--cells 2 needs a device per cell, and the devices are 1 (cpu)" in lines[0], lines


def test_remote_workers_models_alone_are_listed_and_one_unloaded_loads_back(tmp_path: Path) -> None:
    """``--workers tcp`` without ``--repo``: the index lists what the workers serve, not the default zoo
    folder's models (none of theirs); a model a worker announced is unloaded and loaded back."""
    zoo = tmp_path / "home" / ".mainspring" / "zoo" / "mlp" / "1"  # a default zoo from an earlier serve
    zoo.mkdir(parents=True)
    (zoo / "config.json").write_text("{}")
    env = {**SECRET, "HOME": str(tmp_path / "home")}
    server = ServerProcess(None, tmp_path / "server.log", "--workers", "tcp", env=env)
    worker = emulated_worker(server.worker_address, "emulated", tmp_path / "worker.log")
    try:
        server.wait_ready()
        _, index = http_call(f"http://{server.http}/v2/repository/index", b"{}")
        listed = {entry["name"]: entry["state"] for entry in json.loads(index)}
        assert len(listed) == 6 and set(listed.values()) == {"READY"} and "mlp" not in listed, listed
        model = sorted(listed)[0]
        assert repository(server, model, "unload") == 200
        assert infer(server, model, 0)[0] == 404
        assert repository(server, model, "load") == 200
        status, sent, echoed = infer(server, model, 1)
        assert status == 200 and echoed == pytest.approx(sent, rel=1e-6)
    finally:
        worker.terminate()
        worker.wait(30)
        assert server.stop() == 0, server.log.read_text()


@pytest.mark.slow
def test_a_killed_cell_is_served_around_and_comes_back(tmp_path: Path) -> None:
    """Under steady load, cell 0's controller is killed: every request is still answered (served, or a
    clear error), its models are served by cell 1 within 5 s, and cell 0 is back within 30 s."""
    cells = TwoCells(tmp_path, "--slo-ms", "500")
    server, models = cells.server, cells.models
    answers: list[tuple[float, int]] = []
    stop = threading.Event()

    def load() -> None:
        i = 0
        with ThreadPoolExecutor(4) as pool:
            while not stop.is_set():
                sent = time.monotonic()
                pool.submit(lambda k=i, at=sent: answers.append((at, infer(server, models[k % 6], k)[0])))
                i += 1
                time.sleep(0.02)

    loader = threading.Thread(target=load)
    try:
        loader.start()
        time.sleep(3)
        killed_at = time.monotonic()
        os.kill(cells.cell_pid(0), signal.SIGKILL)
        wait_for(lambda: any(v > 0 for labels, v in samples(server, "mainspring_devices") if labels["cell"] == "0")
                 and time.monotonic() - killed_at > 2, timeout_s=30, every_s=0.2)  # fmt: skip
        back_after = time.monotonic() - killed_at
        time.sleep(2)
    finally:
        stop.set()
        loader.join()
        cells.close()
    assert back_after < 30
    sent = len(answers)
    assert sent > 200 and all(status in (200, 503) for _, status in answers), sorted({s for _, s in answers})
    assert sum(status == 200 for _, status in answers) >= 0.97 * sent
    after = [status for at, status in answers if killed_at + 1 <= at <= killed_at + 5]
    assert after and all(status == 200 for status in after)  # cell 1 served every model meanwhile
    text = server.log.read_text()
    assert "cell 0 is gone" in text and "cell 0 is back" in text
