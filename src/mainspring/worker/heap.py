"""A worker process's start-up heap, frozen so that the cycle collector never scans it again.

A worker imports torch, and its first model load imports about 1,200 more modules (torch.export
pulls in sympy, networkx, dynamo): about 320,000 objects that live as long as the process. A full
cycle collection scans them all, about 170 ms on this 2-core machine, and it holds the interpreter
meanwhile, so the exec lane's inference waits (a reload set one off: ``docs/serving.md``). Frozen
(``gc.freeze``), they are skipped, and a full collection takes a few ms.

Only what was imported is frozen, never a model: a frozen object is never collected, and a model
unloaded later must free its weights. So one model of each file format in the repository is read
once and dropped before the freeze, which leaves the modules its loader imported behind.
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
    formats: set[str] = set()
    for model in models:
        try:
            config = repo.config(model)
            if config.format in formats:
                continue
            formats.add(config.format)
            load_module(repo, model)  # for its imports; the module itself is dropped at once
        except Exception as error:  # any reason a model cannot be read: its registration reports it
            log.debug("not priming with %s: %s", model, error)
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("froze the start-up heap (%d objects, formats %s) in %.2f s", frozen, sorted(formats),
             time.perf_counter() - begin)  # fmt: skip
    return frozen
