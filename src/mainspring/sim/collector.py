"""Fewer passes of Python's cycle collector while a simulation runs.

By default CPython scans its youngest generation every 700 new container objects, and the
oldest whenever enough survivors pile up. A simulation keeps every request's record, every
model's estimate tables and its event heap alive, so those scans find nothing to free and the
oldest-generation ones (~50 ms each at 32 devices) grow with the run: 8% of the policy's
measured CPU at 32 devices (`docs/benchmarks/controller-cost.md`), charged to whichever call allocated at the
time. Reference counting still frees everything acyclic at once; only cycles wait longer.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 10_000  # new container objects between passes (CPython's default: 700)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the young generation's threshold for the block, then restore the caller's settings."""
    before = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, before[0]), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
