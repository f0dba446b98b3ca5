"""Triton's poll mode: the poller serves what changed in a real repository folder (in-process emulated worker)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from mainspring.controller.repository_poll import RepositoryPoller
from mainspring.controller.service import ControllerService
from mainspring.models.repository import ModelRepository
from mainspring.protocol import DeviceSpec
from mainspring.transport.inprocess import InProcessWorker
from mainspring.worker.emulated_worker import EmulatedWorker, echo_config
from mainspring.worker.runtimes.emulated import NoiseModel
from tests.fakes import profile


def test_the_poller_loads_reloads_and_unloads_what_changed_and_tries_a_failure_once(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    for name in ("a", "b"):
        repo.write(echo_config(name, (1, 2, 4)))

    async def scenario() -> None:
        service = ControllerService(default_slo_ms=500)
        catalog = {m: profile(m, exec_ms={1: 1.0, 2: 1.5, 4: 2.0}, load_ms=2) for m in ("a", "b", "c")}
        handle = InProcessWorker(  # can serve a, b and c; d is in no catalog (its load fails)
            "emulated", lambda sink: EmulatedWorker([DeviceSpec(0, "v100")], catalog, sink, NoiseModel.exact()),
            service, asyncio.get_running_loop(),
        )  # fmt: skip
        handle.join()
        await service.unload_model("c")  # served from the folders a and b only
        poller = RepositoryPoller(service, repo, period_s=0.01)
        try:
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
        finally:
            await service.drain(1.0)
            handle.close("test over")

    asyncio.run(scenario())


def test_a_poll_period_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="repository_poll_s must be positive"):
        RepositoryPoller(ControllerService(), ModelRepository(tmp_path), 0)
