"""A worker process's start-up heap, frozen so that the cycle collector never scans it again.

A worker imports torch, and its first model load imports about 1,200 more modules (torch.export
pulls in sympy, networkx, dynamo): about 320,000 objects that live as long as the process. A full
cycle collection scans them all, about 170 ms on this 2-core machine, and it holds the interpreter
meanwhile, so the exec lane's inference waits (a reload set one off: ``docs/serving.md``). Frozen
(``gc.freeze``), they are skipped, and a full collection takes a few ms.

What was imported is frozen first, without a model: one model of each file format in the
repository is read once and dropped before the freeze, which leaves the modules its loader imported
behind (the one with the smallest file, as the imports cost the same whatever the model: a large
model is not read twice).

Models come next (``ModelHeap``). An exported resnet18 adds about 4,900 objects that a full
collection scans, 3-4 ms of it here: 30-45 ms with 10 models registered, 100 ms with 30. A full
collection comes when enough new objects have survived, so in a serving worker it is a load or a
reload (allocations) that sets one off, at a moment nothing plans for. Frozen once it registers (a
collection of the young objects first, a few ms), a model is scanned no more. A frozen object is
never collected, though: an unregistered model has let go of its weights already (its parameters
are emptied), and what is left of it (its graph's objects, about 1.2 MB) is collected with the other
unregistered models' once they make up a share of the frozen heap, at the unregistration that
reaches it: one full collection at an operation the user asked for, not at a random load.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable

from mainspring.models.loading import load_module
from mainspring.models.repository import ModelRepository

log = logging.getLogger(__name__)


def freeze_startup_heap(repo: ModelRepository, models: Iterable[str]) -> int:
    """Read one of ``models`` per file format and drop it, collect, then freeze the heap; returns how
    many objects were frozen. A model that cannot be read is skipped here (its registration says why)."""
    begin = time.perf_counter()
    smallest: dict[str, tuple[int, str]] = {}  # format -> (file size, model)
    for model in models:
        try:
            fmt, size = repo.config(model).format, repo.model_file(model).stat().st_size
        except Exception as error:  # any reason a model cannot be read: its registration reports it
            log.debug("not priming with %s: %s", model, error)
            continue
        smallest[fmt] = min(smallest.get(fmt, (size, model)), (size, model))
    formats = sorted(smallest)
    for fmt, (_, model) in sorted(smallest.items()):
        try:
            load_module(repo, model)  # for its imports; the module itself is dropped at once
        except Exception as error:
            log.debug("not priming %s with %s: %s", fmt, model, error)
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("froze the start-up heap (%d objects, formats %s) in %.2f s", frozen, formats,
             time.perf_counter() - begin)  # fmt: skip
    return frozen


COMPACT_SHARE = 0.25  # unregistered models' objects, as a share of the frozen heap, that are collected


class ModelHeap:
    """Freezes each model's objects once it registers; collects those of unregistered models once they
    make up ``compact_share`` of the frozen heap (see the module's text)."""

    def __init__(self, compact_share: float = COMPACT_SHARE) -> None:
        self._share = compact_share
        # gc.get_freeze_count() walks the whole frozen heap (40 ms here): counted once, then kept
        self._total = gc.get_freeze_count()
        self._frozen: dict[str, int] = {}  # model -> objects frozen with it
        self._released = 0  # objects frozen with models since unregistered

    def registered(self, model: str) -> None:
        gc.collect()  # what the load left behind; older objects are frozen, so this scans few
        count = len(gc.get_objects())  # what is not frozen: the model, and what the process made since
        gc.freeze()
        self._frozen[model] = count
        self._total += count

    def unregistered(self, model: str) -> None:
        self._released += self._frozen.pop(model, 0)
        if self._released > self._share * self._total:
            begin = time.perf_counter()
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._total = gc.get_freeze_count()
            log.info("collected %d unregistered models' objects in %.0f ms", self._released,
                     1000 * (time.perf_counter() - begin))  # fmt: skip
            self._released = 0
