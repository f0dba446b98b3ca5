"""One client's bad input fails only that client's request, never its neighbours in the batch."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from mainspring.models.repository import ModelRepository
from tests.serving.processes import ServerProcess, http_call


def bert_body(ids: np.ndarray) -> bytes:
    tensor = {"name": "input_ids", "datatype": "INT64", "shape": [1, 32], "data": ids.tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


@pytest.mark.slow
def test_a_bad_input_fails_alone(small_zoo: ModelRepository, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(small_zoo.root, repo)
    shutil.copytree(repo / "bert_tiny", repo / "bert_unchecked")  # the same model without a declared range
    config_path = repo / "bert_unchecked" / "1" / "config.json"
    config = json.loads(config_path.read_text())
    config["name"] = "bert_unchecked"
    del config["inputs"][0]["valid_range"]
    config_path.write_text(json.dumps(config))
    server = ServerProcess(repo, tmp_path / "server.log", "--slo-ms", "30000")
    try:
        server.wait_ready()
        rng = np.random.default_rng(3)
        bodies = []
        for i in range(64):  # one in eight has negative token ids: the embedding raises IndexError on them
            ids = rng.integers(0, 1000, 32) * (-1 if i % 8 == 3 else 1) - (1 if i % 8 == 3 else 0)
            bodies.append(bert_body(ids))
        url = f"http://{server.http}/v2/models/bert_unchecked/infer"
        assert http_call(url, bodies[0])[0] == 200  # served once: a lone failure is then the input's, not the model's
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda body: http_call(url, body), bodies))
        bad = [answers[i] for i in range(64) if i % 8 == 3]
        good = [answers[i] for i in range(64) if i % 8 != 3]
        assert all(status == 200 for status, _ in good), [s for s, _ in good]
        for status, reply in bad:
            error = json.loads(reply)
            assert status == 400 and error["outcome"] == "input_failed" and "IndexError" in error["error"], reply
        # A declared range turns such an input away at the door, before it reaches a batch.
        status, reply = http_call(f"http://{server.http}/v2/models/bert_tiny/infer", bert_body(np.full(32, 40_000)))
        assert status == 400 and "outside the model's valid_range [0, 30521]" in json.loads(reply)["error"]
        assert "Traceback" not in (tmp_path / "server.log").read_text()
    finally:
        assert server.stop() == 0, (tmp_path / "server.log").read_text()
