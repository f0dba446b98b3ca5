"""A worker's start-up heap is frozen without its models, and a registration hands the interpreter
over often: what keeps a load or a cycle collection from holding the exec lane for 100s of ms."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mainspring.worker.heap as heap
import mainspring.worker.torch_worker as torch_worker
from mainspring.models.loading import export_zoo_model
from mainspring.models.repository import ModelRepository
from mainspring.worker.torch_worker import LOAD_SWITCH_INTERVAL_S, TorchWorker
from tests.torch_models import Results

# Run apart: a freeze in the test process would keep whatever the other tests drop.
FREEZE_THEN_SERVE = textwrap.dedent(
    """
    import gc, sys, weakref
    from mainspring.models.repository import ModelRepository
    from mainspring.worker.heap import freeze_startup_heap
    from mainspring.worker.torch_worker import TorchWorker

    repo = ModelRepository(sys.argv[1])
    frozen = freeze_startup_heap(repo, repo.models())
    worker = TorchWorker(repo, lambda result: None)
    tracked = len(gc.get_objects())  # what a full collection still scans: the model, not the imports
    module = weakref.ref(worker._devices[0]._bindings["mlp"].module)  # its graph holds cycles
    worker.unregister("mlp")
    worker.close()
    del worker
    gc.collect()
    print(frozen, tracked, module() is None)
    """
)


def test_the_start_up_heap_is_frozen_but_models_loaded_later_are_freed(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    export_zoo_model(repo, "mlp")
    script = tmp_path / "freeze.py"
    script.write_text(FREEZE_THEN_SERVE)
    run = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    frozen, tracked, freed = run.stdout.split()
    # torch and what the loader imported: far more than the collector tracks with a model registered
    assert int(frozen) > 10 * int(tracked) > 0
    assert freed == "True", "an unregistered model stayed alive: it was frozen with the heap"


def test_the_heap_is_primed_with_the_smallest_model_of_each_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = ModelRepository(tmp_path)
    export_zoo_model(repo, "resnet18", args={"image_size": 32}, served_as="a_resnet")  # listed first
    export_zoo_model(repo, "mlp")  # the smaller file of the two torch.export models
    export_zoo_model(repo, "bert_tiny", fmt="safetensors")
    read: list[str] = []
    monkeypatch.setattr(heap, "load_module", lambda repo, model: read.append(model))
    monkeypatch.setattr(heap.gc, "freeze", lambda: None)  # not this test process's heap
    heap.freeze_startup_heap(repo, repo.models())
    assert sorted(read) == ["bert_tiny", "mlp"]  # the resnet is not read twice at start-up


def test_a_registration_runs_with_a_short_switch_interval_and_restores_it(
    small_zoo: ModelRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[float] = []
    load = torch_worker.load_module

    def noting(*args: object, **kwargs: object) -> object:
        seen.append(sys.getswitchinterval())
        return load(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch_worker, "load_module", noting)
    before = sys.getswitchinterval()
    worker = TorchWorker(small_zoo, Results().put, models=["mlp"])
    try:
        worker.register("mlp", served_as="mlp@2")
    finally:
        worker.close()
    assert seen and all(interval <= LOAD_SWITCH_INTERVAL_S for interval in seen)
    assert sys.getswitchinterval() == before


UNREGISTER_WITHOUT_COLLECTING = textwrap.dedent(
    """
    import gc, os, sys
    from mainspring.models.repository import ModelRepository
    from mainspring.worker.torch_worker import TorchWorker

    def resident_mb():
        return int(open(f"/proc/{os.getpid()}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

    worker = TorchWorker(ModelRepository(sys.argv[1]), lambda result: None, pool_bytes=64 << 20)
    gc.collect()
    gc.disable()  # as in a worker where no full collection comes for a long time
    before = resident_mb()
    worker.unregister("resnet18_b")
    print(before - resident_mb())
    """
)


def test_an_unregistered_model_lets_go_of_its_weights_without_waiting_for_a_cycle_collection(tmp_path: Path) -> None:
    """An exported module lives on in its reference cycles until a full collection, which a serving
    worker may not run for a long time; its 47 MB of weights stayed allocated with it, so an unload
    (or the old version after a reload) freed no memory."""
    from mainspring.models.loading import copy_model

    repo = ModelRepository(tmp_path)
    export_zoo_model(repo, "resnet18", args={"image_size": 32})
    copy_model(repo, "resnet18", "resnet18_b")
    script = tmp_path / "unregister.py"
    script.write_text(UNREGISTER_WITHOUT_COLLECTING)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # freed tensors go back to the system at once
    run = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300,
                         env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert float(run.stdout.split()[-1]) > 30, "the unregistered model's 47 MB of weights are still held"
