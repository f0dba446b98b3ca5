"""A worker process's start-up heap, frozen so that the cycle collector never scans it again.

A worker imports torch, and its first model load imports about 1,200 more modules (torch.export
pulls in sympy, networkx, dynamo): about 320,000 objects that live as long as the process. A full
cycle collection scans them all, about 170 ms on this 2-core machine, and it holds the interpreter
meanwhile, so the exec lane's inference waits (a reload set one off: ``docs/serving.md``). Frozen
(``gc.freeze``), they are skipped, and a full collection takes a few ms.

Only what was imported is frozen, never a model: a frozen object is never collected, and a model
unloaded later must free its weights. So one model of each file format in the repository is read
once and dropped before the freeze, which leaves the modules its loader imported behind: the one
with the smallest file, as the imports cost the same whatever the model (a large model is not read twice).
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
