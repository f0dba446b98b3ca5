"""Triton-like baseline: dynamic batching up to a fixed maximum, no prediction."""

from __future__ import annotations

from mainspring.scheduler.baselines.reactive import ReactiveScheduler


class TritonScheduler(ReactiveScheduler):
    """Per-model FIFO, dynamic batching (max batch size, max queue delay), LRU on-demand loading.

    Everything it needs is in ``ReactiveScheduler``; this class names the policy.
    """
