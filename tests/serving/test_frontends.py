"""``serve --frontends 2``: a second frontend process shares the HTTP and gRPC ports and hands its
calls to the controller over ZeroMQ; every request is answered exactly once, whichever process
took it, and a frontend that dies is started again."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from mainspring.models.repository import ModelRepository
from tests.serving.processes import ServerProcess, child_pids, http_call
from tests.serving.test_supervision import metric
from tests.waiting import wait_for


def frontend_pid(server: ServerProcess) -> int:
    for pid in child_pids(server.process.pid):
        if "mainspring.frontend.process" in Path(f"/proc/{pid}/cmdline").read_text():
            return pid
    raise AssertionError("no frontend process")


def mlp_request(seed: int) -> tuple[bytes, np.ndarray]:
    data = np.random.default_rng(seed).standard_normal((1, 256)).astype(np.float32)
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 256], "data": data.ravel().tolist()}]}
    return json.dumps(body).encode(), data


@pytest.mark.slow
def test_two_frontend_processes_answer_every_request_once(small_zoo: ModelRepository, tmp_path: Path) -> None:
    shutil.copytree(small_zoo.root, tmp_path / "repo")
    server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", "--frontends", "2", "--slo-ms", "30000")
    try:
        server.wait_ready()
        first_frontend = frontend_pid(server)
        infer = f"http://{server.http}/v2/models/mlp/infer"
        # The same input gives the same output whichever process takes the connection.
        body, data = mlp_request(0)
        status, reply = http_call(infer, body, {"Connection": "close"})
        assert status == 200, reply
        expected, output_name = json.loads(reply)["outputs"][0]["data"], json.loads(reply)["outputs"][0]["name"]

        answers: list[tuple[int, object]] = []
        lock = threading.Lock()

        def client(index: int) -> None:
            for _ in range(15):  # a new connection each time: the kernel spreads them over both processes
                status, reply = http_call(infer, body, {"Connection": "close"})
                outputs = json.loads(reply)["outputs"][0]["data"] if status == 200 else reply
                with lock:
                    answers.append((status, outputs))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        grpc_outputs = []
        for thread in threads:
            thread.start()
        for _ in range(10):
            with grpcclient.InferenceServerClient(server.grpc) as grpc:
                tensor = grpcclient.InferInput("input", [1, 256], "FP32")
                tensor.set_data_from_numpy(data)
                grpc_outputs.append(grpc.infer("mlp", [tensor]).as_numpy(output_name))
        for thread in threads:
            thread.join()

        assert len(answers) == 120 and all(status == 200 for status, _ in answers), answers[:3]
        assert all(np.allclose(outputs, expected, atol=1e-5) for _, outputs in answers)  # type: ignore[arg-type]
        assert all(np.allclose(output.ravel(), expected, atol=1e-5) for output in grpc_outputs)
        handed_over = metric(server, "mainspring_frontend_calls")
        _, stats = http_call(f"http://{server.http}/v2/models/mlp/stats")
        served = json.loads(stats)["model_stats"][0]["inference_count"]
        assert served == 1 + 120 + 10  # each request once: none lost, none run twice
        assert 0 < handed_over < served, "both processes took connections"

        # The repository API, metadata and metrics work from either process.
        for _ in range(6):
            status, reply = http_call(f"http://{server.http}/v2/repository/index", b"{}", {"Connection": "close"})
            assert status == 200 and {m["name"] for m in json.loads(reply)} >= {"mlp"}
            assert http_call(f"http://{server.http}/v2/models/mlp", headers={"Connection": "close"})[0] == 200
            assert http_call(f"http://{server.http}/v2/models/nope", headers={"Connection": "close"})[0] == 404

        # Unloaded or loaded through whichever process: gone from, then back in, every process at once.
        base = f"http://{server.http}/v2"
        assert http_call(f"{base}/repository/models/bert_tiny/unload", b"{}", {"Connection": "close"})[0] == 200
        assert [http_call(f"{base}/models/bert_tiny", headers={"Connection": "close"})[0] for _ in range(6)] == [
            404
        ] * 6
        assert http_call(f"{base}/repository/models/bert_tiny/load", b"{}", {"Connection": "close"})[0] == 200
        assert [http_call(f"{base}/models/bert_tiny", headers={"Connection": "close"})[0] for _ in range(6)] == [
            200
        ] * 6
        # Reloaded in place through whichever process: every process serves the change at once.
        repo = ModelRepository(tmp_path / "repo")
        repo.write(msgspec.structs.replace(repo.config("bert_tiny"), slo_ms=500.0))
        assert http_call(f"{base}/repository/models/bert_tiny/load", b"{}", {"Connection": "close"})[0] == 200
        configs = [http_call(f"{base}/models/bert_tiny/config", headers={"Connection": "close"}) for _ in range(6)]
        assert [(status, json.loads(body)["default_slo_ms"]) for status, body in configs] == [(200, 500.0)] * 6

        # A frontend process that dies is started again, and the ports keep serving meanwhile.
        os.kill(first_frontend, signal.SIGKILL)
        begin = time.monotonic()
        log = tmp_path / "server.log"
        wait_for(lambda: log.read_text().count("frontend frontend-1 joined") == 2, 60)
        print(f"frontend serving again {time.monotonic() - begin:.1f} s after the kill")
        assert frontend_pid(server) != first_frontend
        for _ in range(10):
            assert http_call(infer, body, {"Connection": "close"})[0] == 200
        last_frontend = frontend_pid(server)
    finally:
        assert server.stop() == 0, (tmp_path / "server.log").read_text()
    assert not Path(f"/proc/{last_frontend}").exists(), "the frontend process left with the server"
