"""Triton's poll mode: the poller serves what changed in a real repository folder (in-process emulated worker)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mainspring.controller.repository_poll import RepositoryPoller
from mainspring.controller.service import ControllerService
from mainspring.frontend.dataplane import DataPlane
from mainspring.models.repository import ModelRepository
from mainspring.worker.emulated_worker import echo_config
from mainspring.worker.inprocess import InProcessWorker
from tests.controller.test_service import with_service


def test_the_poller_loads_reloads_and_unloads_what_changed_and_tries_a_failure_once(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    for name in ("a", "b"):
        repo.write(echo_config(name, (1, 2, 4)))

    async def test(service: ControllerService, _: DataPlane, __: InProcessWorker) -> None:
        await service.unload_model("c")  # served from the folders a and b only
        poller = RepositoryPoller(service, repo, period_s=0.01)
        assert await poller.poll() == []  # the baseline: what serving started from
        assert await poller.poll() == []  # nothing changed
        repo.write(echo_config("c", (1, 2, 4)))
        assert await poller.poll() == ["c: new in the repository, loaded"]
        assert "c" in service.models
        repo.write(echo_config("a", (1, 2)))  # another config
        assert await poller.poll() == ["a: changed, reloaded"]
        assert service.models["a"].key == "a@2"
        shutil.rmtree(tmp_path / "b")
        assert await poller.poll() == ["b: gone from the repository, unloaded"]
        assert sorted(service.models) == ["a", "c"]
        repo.write(echo_config("d", (1,)))
        (failed,) = await poller.poll()
        assert failed.startswith("d: ") and "fixed set" in failed and "d" not in service.models
        assert await poller.poll() == []  # tried once per change, not on every poll
        repo.write(echo_config("d", (1, 2)))
        assert (await poller.poll())[0].startswith("d: ")  # changed again: tried again
        changes = (await service.exposition()).decode()
        for change, model, result, count in [("load", "c", "done", 1), ("reload", "a", "done", 1),
                                             ("unload", "b", "done", 1), ("load", "d", "failed", 2)]:  # fmt: skip
            line = f'mainspring_model_changes_total{{change="{change}",model="{model}",result="{result}"}}'
            assert f"{line} {count:.1f}" in changes, changes

    with_service(test, models=("a", "b", "c"), devices=1)  # d is in no catalog: its load fails


def test_a_poll_period_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="repository_poll_s must be positive"):
        RepositoryPoller(ControllerService(), ModelRepository(tmp_path), 0)
