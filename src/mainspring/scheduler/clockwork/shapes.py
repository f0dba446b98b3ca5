"""Batch sizes a model may run at and what a number of its requests costs on a device kind."""

from __future__ import annotations

from collections.abc import Mapping

from mainspring.models.profile import ModelProfile
from mainspring.scheduler.clockwork.estimator import Estimator


class BatchShapes:
    """Supported batch sizes (capped at ``max_batch_size``), padding, and queued work in estimates."""

    def __init__(self, profiles: Mapping[str, ModelProfile], estimator: Estimator, max_batch_size: int) -> None:
        self._profiles = profiles
        self.estimator = estimator
        self._cap = max_batch_size
        self._sizes: dict[str, tuple[int, ...]] = {}

    def forget(self, model: str) -> None:
        self._sizes.pop(model, None)

    def sizes(self, model: str) -> tuple[int, ...]:
        sizes = self._sizes.get(model)
        if sizes is None:
            supported = self._profiles[model].batch_sizes
            sizes = self._sizes[model] = tuple(b for b in supported if b <= self._cap) or (supported[0],)
        return sizes

    def padded(self, model: str, count: int) -> int:
        """The smallest size that holds ``count`` requests (the largest when none does)."""
        sizes = self.sizes(model)
        for size in sizes:
            if size >= count:
                return size
        return sizes[-1]

    def cheapest(self, model: str, count: int, up_to: int, kind: str) -> tuple[int, int]:
        """The size from the one that holds ``count`` up to ``up_to`` with the least estimate, and
        that estimate. Estimates are p99s of short windows: one spike can make a batch of 8 look
        slower than one of 16, and then padding further is the faster (and the feasible) choice."""
        best_size, best_ns = up_to, self.estimator.exec_ns(model, up_to, kind)
        for size in self.sizes(model):
            if count <= size < up_to:
                exec_ns = self.estimator.exec_ns(model, size, kind)
                if exec_ns < best_ns:
                    best_size, best_ns = size, exec_ns
        return best_size, best_ns

    def fastest_ns(self, model: str, kind: str) -> int:
        """Estimate of the smallest batch: the least any request of ``model`` needs on ``kind``."""
        return self.estimator.exec_ns(model, self.sizes(model)[0], kind)

    def work_ns(self, model: str, count: int, kind: str) -> int:
        """Exec time of ``count`` requests: full batches of the largest size, then the cheapest size for the rest."""
        if count <= 0:
            return 0
        largest = self.sizes(model)[-1]
        full, rest = divmod(count, largest)
        work = full * self.estimator.exec_ns(model, largest, kind)
        return work + (self.cheapest(model, rest, largest, kind)[1] if rest else 0)
