"""``serve --ray ADDRESS --cells 2``: a cell per node of a local Ray cluster (a head and a second node),
each cell's controller an actor beside its worker; requests served by both, a cell's controller killed
under load (every request still answered, its models served by the other cell meanwhile, the cell back
with its worker rejoining), and a third node joining as a third cell, which a second frontend process
learns of too. The cells' channels are TCP ports guarded by a secret the server made for the run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from mainspring.models.repository import ModelRepository
from mainspring.serving.config import ServeConfig
from mainspring.serving.ray_cells import RayCells
from mainspring.serving.ray_placement import RayPlacer, RayWorkers
from tests.serving.processes import ServerProcess, alive, cells_on, http_call, workers_on
from tests.serving.test_cells_serve import consecutive_free_ports, samples
from tests.serving.test_ray import actor_pids, add_node, two_nodes
from tests.serving.test_worker_loss import body
from tests.waiting import wait_for


def test_a_node_is_cut_into_cells_of_up_to_16_devices_each_with_a_cpu_for_its_controller() -> None:
    placer = RayPlacer("auto", RayWorkers("", "/repo"), cells=RayCells(ServeConfig(ray="auto", cells=2)))
    gpus = [f"cuda:{i}" for i in range(20)]
    assert [len(group) for group in placer._groups("a", gpus, cpus=8)] == [16, 4]
    assert placer._groups("b", gpus[:8], cpus=1) == [gpus[:8]]
    assert placer._groups("c", gpus, cpus=1) == []  # two controllers, one CPU: said once, no cell
    assert placer._groups("d", ["cpu"], cpus=2) == [["cpu"]]  # the controller's CPU and the device's
    assert placer._groups("e", ["cpu"], cpus=1) == []
    alone = RayPlacer("auto", RayWorkers("tcp://127.0.0.1:1", "/repo"))  # no cells: one group of every device
    assert alone._groups("a", gpus, cpus=1) == [gpus]


def cell_ports(first: int, count: int = 3) -> tuple[list[int], list[int]]:
    """The ports of this test's cells (``ray_cells.PORTS_PER_CELL`` each from ``first``): their workers', and
    their frontends' channels. Processes are found by these, never another server's on this machine."""
    return [first + 3 * i for i in range(count)], [first + 3 * i + 1 for i in range(count)]


def cell_pid(first: int, index: int) -> int:
    found = cells_on(cell_ports(first)[1])
    assert index in found, found
    return found[index]


def devices_by_cell(server: ServerProcess) -> dict[str, float]:
    return {labels["cell"]: value for labels, value in samples(server, "mainspring_devices")}


@pytest.mark.slow
def test_cells_on_ray_serve_around_a_killed_cell_and_grow_with_the_cluster(
    small_zoo: ModelRepository, tmp_path: Path
) -> None:
    shutil.copytree(small_zoo.root, tmp_path / "repo")
    with two_nodes(cpus=2) as (address, env):  # a CPU for the cell's controller, one for its device
        args = ("--ray", address, "--cells", "2", "--frontends", "2", "--slo-ms", "30000")
        ports = consecutive_free_ports(9)  # three ports per cell (after Ray took its own)
        server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", *args, worker_port=ports, env=env)
        log = tmp_path / "server.log"
        stop = threading.Event()
        answers: list[tuple[float, str, int, bytes]] = []
        try:
            server.wait_ready(300)
            assert devices_by_cell(server) == {"0": 1, "1": 1}
            actors = actor_pids(cell_ports(ports)[0])
            assert len(actors) == 2, actors

            def client(model: str) -> None:
                infer = f"http://{server.http}/v2/models/{model}/infer"
                while not stop.is_set():
                    sent = time.monotonic()
                    status, raw = http_call(infer, body(model.removesuffix("_extra")))
                    answers.append((sent, model, status, raw))

            clients = [threading.Thread(target=client, args=(m,), daemon=True) for m in ["mlp", "resnet18"] * 2]
            for thread in clients:
                thread.start()
            wait_for(lambda: len(answers) > 40, 120)

            killed_at = time.monotonic()
            os.kill(cell_pid(ports, 0), signal.SIGKILL)  # under load
            wait_for(lambda: "cell 0 is back" in log.read_text(), 60)
            back_after = time.monotonic() - killed_at
            wait_for(lambda: devices_by_cell(server).get("0") == 1, 60)  # its worker rejoined the new process
            served_by_new = 0.0

            def cell_0_serves() -> bool:
                nonlocal served_by_new
                served_by_new = sum(v for labels, v in samples(server, "mainspring_requests")
                                    if labels["cell"] == "0" and labels.get("outcome") == "success")  # fmt: skip
                return served_by_new > 0

            wait_for(cell_0_serves, 60)  # a restarted cell's counters start at 0: these came after

            add_node(address, env, cpus=2)  # the cluster grows: a third cell
            wait_for(lambda: devices_by_cell(server).get("2") == 1, 180)
            actors += actor_pids(cell_ports(ports)[0])  # the new cell's worker too
            # A model added now goes where there is room: the new cell.
            shutil.copytree(tmp_path / "repo" / "mlp", tmp_path / "repo" / "mlp_extra")
            config = tmp_path / "repo" / "mlp_extra" / "1" / "config.json"
            config.write_text(config.read_text().replace('"name": "mlp"', '"name": "mlp_extra"'))
            status, raw = http_call(f"http://{server.http}/v2/repository/models/mlp_extra/load", b"{}")
            assert status == 200, raw
            extra = threading.Thread(target=client, args=("mlp_extra",), daemon=True)
            extra.start()
            clients.append(extra)
            wait_for(lambda: any(labels["cell"] == "2" and labels["model"] == "mlp_extra" and v > 0
                                 for labels, v in samples(server, "mainspring_requests")), 120)  # fmt: skip
            stop.set()
            for thread in clients:
                thread.join()
        finally:
            stop.set()
            assert server.stop() == 0, log.read_text()
        assert back_after < 30
        assert len(answers) > 80
        failed = [(at - killed_at, model, status, raw) for at, model, status, raw in answers if status != 200]
        assert not failed, failed[:5]
        first = {"mlp_extra": "mlp"}  # a copy of mlp: its answers too
        for model in ("mlp", "resnet18", "mlp_extra"):  # the same input, the same answer, whichever cell served it
            outputs = [json.loads(raw)["outputs"][0]["data"] for _, m, _, raw in answers if m == model]
            expected = next(json.loads(raw)["outputs"][0]["data"] for _, m, _, raw in answers
                            if m == first.get(model, model))  # fmt: skip
            assert outputs and all(output == pytest.approx(expected, rel=1e-4, abs=1e-6) for output in outputs)
        text = log.read_text()
        assert "cell 0 is gone" in text and text.count("cell 2 joined") == 2  # both frontend processes
        assert "use one made for this run" in text
        workers, channels = cell_ports(ports)
        wait_for(lambda: not workers_on(workers) and not cells_on(channels) and not any(map(alive, actors)), 30)
