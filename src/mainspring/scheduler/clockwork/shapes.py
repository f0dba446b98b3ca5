"""Batch sizes a model may run at and what a number of its requests costs on a device kind."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from mainspring.models.profile import ModelProfile
from mainspring.scheduler.estimator import Estimator
from mainspring.scheduler.lanes import NEVER

Estimates = tuple[tuple[tuple[int, int], ...], int]  # a model's (size, estimate) table and its least estimate


class BatchShapes:
    """Supported batch sizes (capped at ``max_batch_size``), padding, and queued work in estimates."""

    def __init__(
        self, profiles: Mapping[str, ModelProfile], estimator: Estimator, max_batch_size: int, monotone: bool = True
    ) -> None:
        self._profiles = profiles
        self.estimator = estimator
        self._cap = max_batch_size
        self._monotone = monotone
        self._sizes: dict[str, tuple[int, ...]] = {}
        # kind -> model -> its sizes with their estimates, and the least estimate (see ``estimates``)
        self._estimates: dict[str, dict[str, Estimates]] = {}
        estimator.watch(self._estimates_changed)

    def forget(self, model: str) -> None:
        self._sizes.pop(model, None)
        for by_model in self._estimates.values():
            by_model.pop(model, None)

    def _estimates_changed(self, kind: str, model: str | None) -> None:
        by_model = self._estimates.get(kind)
        if by_model is not None:
            if model is None:
                by_model.clear()  # in place: ``of_kind`` hands out this dict
            else:
                by_model.pop(model, None)

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

    def fastest_ns(self, model: str, kind: str) -> int:
        """The least any request of ``model`` needs on ``kind``: the least estimate of any size (the
        smallest size's, with monotone estimates). Not the smallest size's raw estimate: one stall in
        its window (a live CPU worker measured 104 ms for a 15 ms batch) would turn every lone request
        away while a larger size's sane estimate says it can be served."""
        by_model = self._estimates.get(kind)
        cached = None if by_model is None else by_model.get(model)
        return (cached or self.estimates(model, kind))[1]

    def estimates(self, model: str, kind: str) -> Estimates:
        """``((size, estimate), ...)`` for the model's sizes, smallest first, and the least estimate.
        Kept until the estimator reports a change that could move them: the planner reads them for
        every waiting model on every pass, and most have not been measured since."""
        by_model = self._estimates.get(kind)
        cached = None if by_model is None else by_model.get(model)
        if cached is None:
            sizes = self._sizes.get(model) or self.sizes(model)
            estimates = self._monotone_estimates(model, sizes, kind)
            least = estimates[0] if self._monotone else min(estimates)  # monotone: the smallest size's
            cached = self.of_kind(kind)[model] = (tuple(zip(sizes, estimates, strict=True)), least)
        return cached

    def of_kind(self, kind: str) -> dict[str, Estimates]:
        """The kind's ``estimates`` kept so far, by model: a loop over many models reads this
        dict itself (``estimates`` on a miss). Changes are made in place, so it stays current."""
        by_model = self._estimates.get(kind)
        if by_model is None:
            by_model = self._estimates[kind] = {}
        return by_model

    def table(self, model: str, kind: str) -> tuple[tuple[int, int], ...]:
        """The (size, estimate) table, computed afresh. With ``monotone`` a size's estimate is at most
        any larger size's: a batch runs no slower than a larger one (padding it would make it that
        one), so one spike in a small size's window neither stops that size from running (and being
        measured again) nor makes a larger padded batch look the faster choice."""
        sizes = self.sizes(model)
        return tuple(zip(sizes, self._monotone_estimates(model, sizes, kind), strict=True))

    def _monotone_estimates(self, model: str, sizes: tuple[int, ...], kind: str) -> list[int]:
        """``table``'s estimates alone: recomputed for most models whenever the kind's ratio moves."""
        estimates = self.estimator.exec_table(model, sizes, kind)
        if self._monotone:  # each size's estimate at most any larger size's: the least from its size up
            least = estimates[-1]
            for i in range(len(estimates) - 2, -1, -1):
                if estimates[i] > least:
                    estimates[i] = least
                else:
                    least = estimates[i]
        return estimates

    def exec_ns(self, model: str, size: int, kind: str) -> int:
        """The planner's estimate of one batch of ``size`` (one of the model's sizes; see ``table``)."""
        for table_size, exec_ns in self.estimates(model, kind)[0]:
            if table_size == size:
                return exec_ns
        return self.estimator.exec_ns(model, size, kind)

    def largest_batch_by(self, model: str, kind: str, start_ns: int, finish_by_ns: int) -> int:
        """The largest batch size of ``model`` that, started at ``start_ns``, ends by ``finish_by_ns``; 0 if
        none does."""
        for size, exec_ns in reversed(self.estimates(model, kind)[0]):
            if start_ns + exec_ns <= finish_by_ns:
                return size
        return 0

    def work_ns(self, model: str, count: int, kind: str) -> int:
        """Exec time of ``count`` requests in the least lane time, as the planner serves them
        (``split_padding``): 5 requests as a batch of 4 and one of 1 where a batch of 8 would take longer."""
        if count <= 0:
            return 0
        table, least = self.estimates(model, kind)
        return least if count == 1 else least_work(table, count)  # one request: the least estimate of any size


def cheapest_in(table: tuple[tuple[int, int], ...], count: int, up_to: int) -> tuple[int, int] | None:
    """On a model's (size, estimate) table: the size from the one that holds ``count`` up to ``up_to``
    with the least estimate (ties: the smaller), and that estimate; None if ``up_to`` is not one of
    its sizes. With monotone estimates that is the size that holds ``count``; without, one spike can
    make a batch of 8 look slower than one of 16, and padding picks 16."""
    best_size, best_ns, up_to_ns = 0, NEVER, -1
    for size, exec_ns in table:  # smallest first: ties go to the smaller
        if size >= up_to:
            if size == up_to:
                up_to_ns = exec_ns
            break
        if count <= size and exec_ns < best_ns:
            best_size, best_ns = size, exec_ns
    if up_to_ns < 0:
        return None
    return (best_size, best_ns) if best_ns <= up_to_ns else (up_to, up_to_ns)


@functools.lru_cache(maxsize=1 << 16)  # on the planner's hot path; tables repeat across model copies
def first_of_split(table: tuple[tuple[int, int], ...], count: int, up_to: int) -> tuple[int, int]:
    """The batch to run first when ``count`` requests are served in the least lane time with sizes up
    to ``up_to``, as (size, estimate): its largest batch. Padding 12 requests to a batch of 16 costs
    more lane time than a batch of 8 and one of 4, which also finish them all sooner; 14 are padded
    (8 + 4 + 2 would take longer). Ties go to fewer batches."""
    _, _, size, exec_ns = _least_split(table, count, up_to)
    return size, exec_ns


EXACT_SPLIT_BATCHES = 4  # counts up to this many of the largest batch are split exactly (``least_work``)


@functools.lru_cache(maxsize=1 << 16)  # admission asks it of queues on every arrival; tables repeat
def least_work(table: tuple[tuple[int, int], ...], count: int) -> int:
    """The least lane time that serves ``count`` requests with the table's sizes. Not full batches
    of the largest size, then the rest padded: with a stall in the largest size's estimate (a size
    that rarely runs keeps one) that overstated a queue of five on a CPU threefold, and admission
    refused what the planner would have served. Beyond a few of the largest batches, the bulk runs
    in full batches of the size with the least time per request."""
    largest = table[-1][0]
    bulk = 0
    if count > EXACT_SPLIT_BATCHES * largest:
        size, exec_ns = min(table, key=lambda entry: (entry[1] / entry[0], -entry[0]))
        batches = (count - EXACT_SPLIT_BATCHES * largest) // size + 1
        bulk, count = batches * exec_ns, count - batches * size
    # ``_least_split``'s recurrence for the lane time alone: its tuples (batches, largest batch) cost
    # admission 1.9% more instructions per request at 8 devices, for answers only the planner needs
    best = [0] * (count + 1)  # best[c]: the least lane time for c requests
    for c in range(1, count + 1):
        best[c] = min(best[c - size if c > size else 0] + exec_ns for size, exec_ns in table)
    return bulk + best[count]


def _least_split(table: tuple[tuple[int, int], ...], count: int, up_to: int) -> tuple[int, int, int, int]:
    """(lane time, batches, largest batch, its estimate) of the least-lane-time way to serve ``count``
    requests with sizes up to ``up_to``; ties go to fewer batches."""
    sizes = [(size, exec_ns) for size, exec_ns in table if size <= up_to]
    # best[c]: (lane time, batches, largest batch, its estimate) to serve c requests
    best: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)]
    for c in range(1, count + 1):
        options = []
        for size, exec_ns in sizes:
            work, parts, largest, largest_ns = best[max(0, c - size)]
            first = (size, exec_ns) if size >= largest else (largest, largest_ns)
            options.append((work + exec_ns, parts + 1, *first))
        best.append(min(options, key=lambda o: (o[0], o[1])))
    return best[count]
