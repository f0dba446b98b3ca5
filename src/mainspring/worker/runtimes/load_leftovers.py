"""What reading a model leaves behind in the worker process, let go of when the model goes.

A worker that pages models in and out through the repository API reads a model file at every
load; over unload+load cycles of the zoo's resnet18 (a ``torch.export`` file) its memory grew by
about 35 MB per 100 cycles (``benchmarks/worker_churn.py``), for three reasons:

- torch.fx keeps the source of every graph module it generates, for tracebacks, for the life of the
  process (``torch.fx.graph_module._loader`` and ``linecache``): six modules, 107 KB per resnet18 read.
- ``ShapeEnv`` methods cached with ``functools.lru_cache`` keep every shape environment they were
  called on, and with it its fake-tensor cache (``get_implications``'s cache has no bound).
- glibc keeps the memory a read frees in its heaps and arenas (the read allocates in small pieces, from
  the registering thread's arena): ``malloc_trim`` hands it back.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import linecache
import logging
from collections.abc import Callable, Iterator

from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.graph_module import _loader as fx_sources

log = logging.getLogger(__name__)


class LoadLeftovers:
    """Tracks the generated sources of each registered model, and frees what a read or a removal left."""

    def __init__(self, enabled: bool = True) -> None:
        """``enabled=False`` keeps everything, as before (``benchmarks/worker_churn.py`` compares)."""
        self.enabled = enabled
        self._sources: dict[str, set[str]] = {}
        self._trim = _malloc_trim()

    @contextlib.contextmanager
    def reading(self, model: str) -> Iterator[None]:
        """Around the registration of ``model``: the sources generated meanwhile are its own (registrations
        are serial, and nothing else generates graph code), and go with it, or at once if it fails."""
        before = set(fx_sources.eval_cache)
        succeeded = False
        try:
            yield
            succeeded = True
        finally:
            self._sources.setdefault(model, set()).update(set(fx_sources.eval_cache) - before)
            if not succeeded:
                self.forget(model)
            elif self.enabled:
                self._drop_shape_caches()  # the read is over: they serve only a read in progress
                self.trim()

    def forget(self, model: str) -> None:
        """``model`` is no longer served: drop its generated sources and give freed memory back."""
        sources = self._sources.pop(model, set())
        if not self.enabled:
            return
        for key in sources:
            fx_sources.eval_cache.pop(key, None)
            linecache.cache.pop(key, None)
        self._drop_shape_caches()
        self.trim()

    def sources(self, model: str) -> int:
        """How many generated sources ``model`` holds (what ``forget`` would drop)."""
        return len(self._sources.get(model, ()))

    def trim(self) -> None:
        """Give the heap's free memory back to the system (glibc; elsewhere nothing)."""
        if self.enabled and self._trim is not None:
            self._trim(0)

    @staticmethod
    def _drop_shape_caches() -> None:
        for attribute in vars(ShapeEnv).values():
            cache_clear = getattr(attribute, "cache_clear", None)
            if callable(cache_clear):
                cache_clear()


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        log.debug("no malloc_trim in %s: freed heap memory stays with the process", name)
        return None
    return trim
