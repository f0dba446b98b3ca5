"""A worker's memory over model churn (issue 55): unload+load cycles of a torch.export resnet18 must not grow it."""

from __future__ import annotations

import concurrent.futures
import gc
import linecache
import multiprocessing
import threading
from collections.abc import Iterator

import pytest
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.graph_module import _loader as fx_sources

from mainspring.models.loading import export_zoo_model
from mainspring.models.repository import ModelRepository
from mainspring.protocol import ActionStatus
from mainspring.protocol.models import ModelOperation, ModelTarget
from mainspring.protocol.pages import MIB
from mainspring.worker.api import apply_model_operation
from mainspring.worker.torch_worker import TorchWorker
from tests.torch_models import Results

CYCLES = 8


def held_by_reads() -> tuple[int, int]:
    """What reading torch.export files kept for the life of the process before issue 55, counted: torch.fx's
    generated sources and shape environments (each with its fake-tensor cache). RSS over churn is measured by
    benchmarks/worker_churn.py: over a run this short, how the C heap is cut up moves it by up to 15 MB either way
    on a busy machine, more than what the code before left per 100 cycles (17-18 MB here)."""
    gc.collect()
    return len(fx_sources.eval_cache), sum(type(o) is ShapeEnv for o in gc.get_objects())


@pytest.fixture(scope="module")
def resnet_repo(tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    """resnet18 as a torch.export file (the format whose reads left memory behind), small, batch sizes 1 and 2."""
    repo = ModelRepository(tmp_path_factory.mktemp("churn"))
    export_zoo_model(repo, "resnet18", args={"image_size": 32}, batch_sizes=(1, 2))
    return repo


@pytest.fixture
def worker(resnet_repo: ModelRepository) -> Iterator[tuple[TorchWorker, Results]]:
    results = Results()
    w = TorchWorker(resnet_repo, results.put, models=["resnet18"], pool_bytes=64 * MIB)
    yield w, results
    w.close()


def unload_and_load(worker: TorchWorker, results: Results, model: str = "resnet18") -> None:
    """What the repository API's unload then load make a worker do, each operation on a thread of its own
    as in the worker process; then a load of the weights into pages."""
    for op_id, operation in enumerate((ModelOperation.UNLOAD, ModelOperation.LOAD)):
        replies = []
        target = ModelTarget(model)
        thread = threading.Thread(
            target=lambda: replies.append(apply_model_operation(worker, op_id, operation, target))  # noqa: B023
        )
        thread.start()
        thread.join()
        assert not replies[0].error, replies[0].error
    load = results.load(model)
    worker.submit(load)
    assert results.wait(load.action_id).status is ActionStatus.OK
    evict = results.evict(model)
    worker.submit(evict)
    assert results.wait(evict.action_id).status is ActionStatus.OK


def counts_over_cycles(repo_root: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """``held_by_reads`` after one unload+load cycle and after ``CYCLES`` more, in this process."""
    results = Results()
    w = TorchWorker(ModelRepository(repo_root), results.put, models=["resnet18"], pool_bytes=64 * MIB)
    try:
        unload_and_load(w, results)
        before = held_by_reads()
        for _ in range(CYCLES):
            unload_and_load(w, results)
        return before, held_by_reads()
    finally:
        w.close()


def test_unload_and_load_cycles_leave_nothing_behind(resnet_repo: ModelRepository) -> None:
    # In a fresh interpreter, as a worker process is: exports other tests ran in this one leave torch state
    # (symbolic sizes held in lists of its own) that keeps some later reads' shape environments alive.
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        before, after = pool.submit(counts_over_cycles, str(resnet_repo.root)).result(timeout=600)
    assert after == before  # the code before: 6 more sources and 1 more shape environment a cycle


def test_an_unloaded_model_leaves_no_generated_source_behind(worker: tuple[TorchWorker, Results]) -> None:
    w, _ = worker
    held = w.leftovers.sources("resnet18")
    assert held > 0  # torch.fx generated the exported module's code, kept for tracebacks while it is served
    sources_before = len(linecache.cache)
    w.unregister("resnet18")
    assert w.leftovers.sources("resnet18") == 0
    assert len(linecache.cache) <= sources_before - held
