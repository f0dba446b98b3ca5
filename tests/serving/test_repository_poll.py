"""``serve --repository-poll-s``: a version copied into the repository is served, a removed model is not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from mainspring.models.loading import export_zoo_model
from mainspring.models.repository import ModelRepository
from tests.serving.processes import ServerProcess, http_call
from tests.serving.test_kserve import MlpClients
from tests.waiting import wait_for


@pytest.mark.slow
def test_a_polled_repository_is_served_as_it_changes(small_zoo: ModelRepository, tmp_path: Path) -> None:
    shutil.copytree(small_zoo.root, tmp_path / "repo")
    repo = ModelRepository(tmp_path / "repo")
    flags = ("--repository-poll-s", "0.2", "--slo-ms", "30000")
    server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", *flags)
    data = np.random.default_rng(0).standard_normal((1, 256), dtype=np.float32)
    try:
        server.wait_ready()
        base = f"http://{server.http}/v2"
        with MlpClients(server.http, data) as clients:
            (tmp_path / "other").mkdir()
            export_zoo_model(ModelRepository(tmp_path / "other"), "mlp", seed=1)
            shutil.copytree(tmp_path / "other" / "mlp" / "1", tmp_path / "staging")
            (tmp_path / "staging").rename(repo.path("mlp", 1).parent / "2")  # whole, at once: as a deployment would
            wait_for(lambda: json.loads(http_call(f"{base}/models/mlp")[1])["versions"] == ["2"], 60)
            shutil.rmtree(tmp_path / "repo" / "bert_tiny")
            wait_for(lambda: http_call(f"{base}/models/bert_tiny")[0] == 404, 60)
        versions = clients.versions
        assert clients.failures == [] and versions[0] == "1" and versions[-1] == "2", (clients.failures, versions[-3:])
        log = tmp_path / "server.log"
        assert "repository poll: mlp: changed, reloaded" in log.read_text()
        # logged once the workers let the model go too, which may come after its 404
        wait_for(lambda: "repository poll: bert_tiny: gone from the repository, unloaded" in log.read_text(), 60)
        assert httpclient.InferenceServerClient(server.http).is_model_ready("resnet18")  # untouched
    finally:
        assert server.stop() == 0, (tmp_path / "server.log").read_text()
