"""The three actions a controller sends to a worker.

Each carries a window ``[earliest_ns, latest_ns]`` in which it must start and the
controller's estimate of how long it takes; a worker refuses what it cannot start
inside the window and never improvises.
"""

from __future__ import annotations

import msgspec


class _ActionFields(msgspec.Struct, frozen=True):
    """What every action carries: who runs it, on what, and its start window."""

    action_id: int
    device: int
    model: str
    earliest_ns: int
    latest_ns: int
    expected_duration_ns: int


class LoadWeights(_ActionFields, frozen=True, tag=True):
    """Copy a model's weights from host memory into the device's page pool."""


class EvictWeights(_ActionFields, frozen=True, tag=True):
    """Return a model's pages to the device's page pool."""


class Infer(_ActionFields, frozen=True, tag=True):
    """Run one batch of requests; ``batch_size`` is the padded, supported size. ``deadlines_ns`` (one
    per request, or none): when each request's result must be ready at the worker, its deadline less
    the controller's margin for the answer's trip back (every policy sends that meaning); they bound
    how long a failed batch may spend running requests alone."""

    request_ids: tuple[int, ...]
    batch_size: int
    deadlines_ns: tuple[int, ...] = ()


Action = LoadWeights | EvictWeights | Infer


def action_kind(action: Action) -> str:
    """Short lower-case name used in logs and reports."""
    if isinstance(action, Infer):
        return "infer"
    if isinstance(action, LoadWeights):
        return "load"
    return "evict"
