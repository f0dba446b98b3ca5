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
        self._fastest: dict[tuple[str, str], int] = {}  # valid for one estimator generation
        self._fastest_generation = -1

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
        """The least any request of ``model`` needs on ``kind``: the least estimate of any size, as
        padding picks (``cheapest``). Usually the smallest batch's; but one stall in its window (a live
        CPU worker measured 104 ms for a 15 ms batch) would otherwise turn every lone request away
        while the planner serves such requests padded to a size whose estimate is sane."""
        estimator = self.estimator
        if estimator.generation != self._fastest_generation:  # estimates changed: forget the derived values
            self._fastest.clear()
            self._fastest_generation = estimator.generation
        key = (model, kind)
        fastest = self._fastest.get(key)
        if fastest is None:
            fastest = self._fastest[key] = min(estimator.exec_ns(model, size, kind) for size in self.sizes(model))
        return fastest

    def work_ns(self, model: str, count: int, kind: str) -> int:
        """Exec time of ``count`` requests: full batches of the largest size, then the cheapest size for the rest."""
        if count <= 0:
            return 0
        largest = self.sizes(model)[-1]
        full, rest = divmod(count, largest)
        work = full * self.estimator.exec_ns(model, largest, kind)
        return work + (self.cheapest(model, rest, largest, kind)[1] if rest else 0)
