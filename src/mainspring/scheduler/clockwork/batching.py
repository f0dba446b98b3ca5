"""Which batch a device's exec lane runs next: every waiting model's best batch, then the trade-off.

``BatchPlanner.weigh`` gives each model waiting on a device the largest batch that meets its most
urgent deadline there (``Choice``, ordered by slack); the policy runs the least-slack one unless
``trade_off`` says otherwise (a model within its share keeps deadline order against models over
theirs; past saturation the most efficient batch). Deciding only: the planner issues nothing and
answers nothing; the one request it may reject, a head no holder can serve any more, goes through
``PolicyState.feasible_head``, which leaves the answer to the policy.
"""

from __future__ import annotations

from typing import NamedTuple

from mainspring.protocol import Request
from mainspring.scheduler.clockwork.queues import ModelQueue
from mainspring.scheduler.clockwork.shapes import cheapest_in, first_of_split, least_work
from mainspring.scheduler.clockwork.state import PolicyState
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.lanes import NEVER

SHEDDING_SHARE = 0.1  # a device is shedding load once this share of its recent requests expired in queue


class Choice(NamedTuple):
    """A candidate batch; ordered by slack (the most urgent request's, after this batch)."""

    slack_ns: int
    model: str
    start_ns: int
    n_requests: int
    batch_size: int
    ready_by_ns: int  # of its most urgent request
    skip: int = 0  # most urgent requests passed over (they stay queued; see ``_keep_backlog_whole``)

    @property
    def exec_ns(self) -> int:
        """The batch's estimate (its slack is what its deadline leaves after it)."""
        return self.ready_by_ns - self.start_ns - self.slack_ns


_new_choice = tuple.__new__  # a Choice from its fields' tuple, without the named tuple's Python-level __new__


class BatchPlanner:
    """Weighs the waiting models of a device and picks the batch to run next."""

    def __init__(self, state: PolicyState) -> None:
        self.state = state
        self.config = state.config
        self._gather_max_ns = state.config.gather_max_ns

    def weigh(self, device: DeviceState, start_ns: int, now_ns: int) -> list[Choice]:
        """Each waiting model's ``best_batch`` here (those it finds), in model order (sorted: runs
        repeat across processes). This weighs every waiting model for every batch issued (a quarter
        of the policy's time at 32 devices), and most queues hold one request: with monotone
        estimates the smallest size is also the cheapest, so such a queue runs at that size if at
        all, read here from its estimate. The other queues go the general way."""
        choices = []
        loading, queues = device.loading, self.state.queues
        kind = device.kind
        kept, estimates = self.state.shapes.of_kind(kind), self.state.shapes.estimates
        lone = self.config.monotone_estimates
        for model in sorted(device.waiting):
            if model in loading:
                continue  # planned when the load reports (``best_batch``)
            queue = queues[model]
            head = queue.head() if lone and queue.count == 1 else None
            if head is None:
                choice = self.best_batch(device, model, start_ns, now_ns)
            else:
                size, exec_ns = (kept.get(model) or estimates(model, kind))[0][0]
                deadline = head.ready_by_ns
                if deadline - start_ns >= exec_ns:
                    fields = (deadline - start_ns - exec_ns, model, start_ns, 1, size, deadline, 0)
                    choices.append(_new_choice(Choice, fields))
                    continue
                choice = self._best_batch_of_feasible(device, queue, head, start_ns, now_ns)  # none fits here
            if choice is not None:
                choices.append(choice)
        return choices

    def gather_until(self, device: DeviceState, choice: Choice, now_ns: int) -> int | None:
        """When to run ``choice``, if its lane should wait for one more request first (None: now).
        The policy asks only when no other model waits on the device (the idle lane would delay
        them too, and their deadlines are not weighed here).

        Only a batch that takes its model's whole queue and could hold one more: one more request
        saves the lane ``saved = least_work(n) + least_work(1) - least_work(n + 1)`` (a padded place
        filled for nothing, or one batch instead of two). If it arrives after ``t`` of waiting the
        lane spends ``t + least_work(n + 1)`` instead of ``least_work(n) + least_work(1)``; if none
        comes within a wait ``w``, the lane idled ``w``. With arrivals at rate ``r`` the expected
        saving grows with ``w`` when ``r * saved > 1`` and shrinks otherwise. So the lane waits
        when at least one arrival is expected within ``saved``, and ``saved`` long: the longest
        wait after which the newcomer still ends no later than it would alone after the batch.
        Counted from the later of the lane's freeing and the head's arrival, at most
        ``gather_max_ms``, and only while the batch one larger would still meet the head's
        deadline. ``r``: the model's arrival rate over its holders."""
        if self._gather_max_ns is None or choice.skip:
            return None
        model = choice.model
        queue = self.state.queues[model]
        n = queue.count
        table, least = self.state.shapes.estimates(model, device.kind)
        if choice.n_requests < n or n >= table[-1][0]:
            return None
        expected_per_ns = self.state.demand.arrivals_per_ns(model, now_ns) / len(self.state.residency.holding(model))
        if expected_per_ns * least < 1.0:  # ``saved`` is at most the least estimate: most batches end here
            return None
        saved = least_work(table, n) + least - least_work(table, n + 1)
        if saved <= 0 or expected_per_ns * saved < 1.0:
            return None
        head = queue.head()
        assert head is not None  # the queue holds the chosen batch
        until = max(device.exec_lane.free_ns, head.arrival_ns) + min(saved, self._gather_max_ns)
        if until <= now_ns or until + least_work(table, n + 1) > choice.ready_by_ns:
            return None
        return until

    def best_batch(self, device: DeviceState, model: str, start_ns: int, now_ns: int) -> Choice | None:
        """The largest batch of ``model`` that meets its most urgent deadline here, with its slack."""
        if model in device.loading:
            return None  # planned when the load reports: an infer must never race its own load
        queue = self.state.queues[model]
        head = queue.head()
        # A batch that fits here proves the head feasible (this device holds the model, ready by
        # ``start_ns``): only when none fits is it worth asking every holder (``feasible_head``).
        choice = None if head is None else self._batch_within(device, queue, head, start_ns, head.ready_by_ns)
        if choice is None:
            return self._best_batch_of_feasible(device, queue, head, start_ns, now_ns)
        if not self.config.whole_batches or self._whole(queue, choice):
            return choice
        return self._keep_backlog_whole(device, queue, start_ns, choice)

    def _best_batch_of_feasible(
        self, device: DeviceState, queue: ModelQueue, head: Request | None, start_ns: int, now_ns: int
    ) -> Choice | None:
        """``best_batch`` once no batch for the head fits here: for the most urgent request some holder can serve."""
        feasible = self.state.feasible_head(queue, now_ns)
        if feasible is None or feasible is head:
            return None
        choice = self._batch_within(device, queue, feasible, start_ns, feasible.ready_by_ns)
        if self.config.whole_batches and choice is not None:
            choice = self._keep_backlog_whole(device, queue, start_ns, choice)
        return choice

    def _whole(self, queue: ModelQueue, choice: Choice) -> bool:
        """Does ``choice`` take as much of the queue as one batch can?"""
        return choice.n_requests >= min(queue.count, self.state.shapes.sizes(queue.model)[-1])

    def _keep_backlog_whole(self, device: DeviceState, queue: ModelQueue, start_ns: int, choice: Choice) -> Choice:
        """Keep a backlog's batches whole. When the most urgent request only allows a part of the
        queue to run and the rest could not follow in time, serving it would leave every later
        batch of the model short (the collapse of deadline order under overload). Instead run the
        largest batch that fits from the first request whose deadline allows it; the requests
        passed over stay queued (another device may serve them) and expire if none can."""
        model, shapes = queue.model, self.state.shapes
        largest = shapes.sizes(model)[-1]
        if self._whole(queue, choice):
            return choice
        deadlines = sorted(r.ready_by_ns for r in queue.requests())
        count, n = len(deadlines), choice.n_requests
        kind = device.kind
        after = start_ns + shapes.exec_ns(model, choice.batch_size, kind)
        rest = shapes.padded(model, min(count - n, largest))
        if after + shapes.exec_ns(model, rest, kind) <= deadlines[n]:
            return choice  # the rest can follow: nothing is lost by serving the head first
        if self._holders_take_rest(device, model, start_ns, after, count - n, deadlines[n]):
            return choice  # this device after the chosen batch and the other holders can take the rest
        for skip in range(1, count):
            size = shapes.padded(model, min(count - skip, largest))
            exec_ns = shapes.exec_ns(model, size, kind)
            if start_ns + exec_ns <= deadlines[skip]:
                n_requests = min(count - skip, size)
                return Choice(
                    deadlines[skip] - start_ns - exec_ns, model, start_ns, n_requests, size, deadlines[skip], skip
                )
        return choice

    def _holders_take_rest(
        self, device: DeviceState, model: str, start_ns: int, after_ns: int, rest: int, finish_by_ns: int
    ) -> bool:
        """Whether the model's holders, one batch each (``device`` from ``after_ns``), can serve ``rest``
        requests by ``finish_by_ns``.
        Room for one request is not enough: with many holders each would serve only its head, and
        a hot model's backlog would run in batches of one or two on every holder, the lanes full
        and the queue expiring (the Azure sample's x30 burst: 500-800 misses on 4 of 7 seeds)."""
        room, shapes = 0, self.state.shapes
        for other in self.state.residency.holding(model):
            free = after_ns if other is device else max(start_ns, other.exec_lane.free_ns, other.ready_ns[model])
            room += shapes.largest_batch_by(model, other.kind, free, finish_by_ns)
            if room >= rest:
                return True
        return False

    def _batch_within(
        self, device: DeviceState, queue: ModelQueue, head: Request, start_ns: int, finish_by_ns: int
    ) -> Choice | None:
        """The largest batch of ``queue``'s model starting at ``start_ns`` that ends by ``finish_by_ns``;
        ``head`` is the queue's most urgent request."""
        model, kind = queue.model, device.kind
        table, fastest = self.state.shapes.estimates(model, kind)
        latest_end = finish_by_ns - start_ns
        if latest_end < fastest:
            return None  # no size fits (the common answer on a booked lane)
        smallest = table[0][0]
        longest = self.config.max_batch_slo_fraction * head.slo_ns if len(device.waiting) > 1 else NEVER
        for size, exec_ns in reversed(table):
            if exec_ns <= latest_end and (exec_ns <= longest or size == smallest):
                count = min(queue.count, size)
                cheapest = cheapest_in(table, count, size)
                assert cheapest is not None  # ``size`` is one of the table's
                padded, padded_ns = cheapest
                if self.config.split_padding and padded > count:
                    padded, padded_ns = first_of_split(table, count, size)
                    count = min(count, padded)
                return Choice(head.ready_by_ns - start_ns - padded_ns, model, start_ns, count, padded, head.ready_by_ns)
        return None

    def batch_within_head(self, device: DeviceState, model: str, start_ns: int, finish_by_ns: int) -> Choice | None:
        """``_batch_within`` for ``model``'s queue and its head."""
        queue = self.state.queues[model]
        head = queue.head()
        return None if head is None else self._batch_within(device, queue, head, start_ns, finish_by_ns)

    # --- the trade-off ----------------------------------------------------------------------
    def trade_off(self, device: DeviceState, chosen: Choice, choices: list[Choice], now_ns: int) -> Choice:
        """What to run instead of the least-slack batch, when the candidates cannot all be served.
        A model within its share keeps deadline order against models over theirs (isolation)."""
        over_share = self.state.demand.over_share
        chosen_over = over_share(chosen.model, device, now_ns)
        if (
            self.config.efficient_when_contended
            and device.shedding(now_ns, SHEDDING_SHARE)
            and (chosen_over or not any(over_share(c.model, device, now_ns) for c in choices))
        ):
            efficient = self._most_efficient_if_contended(device, chosen, choices)
            if efficient is not None:
                return efficient
        if self.config.lookahead and chosen_over:
            return self._spare_the_next(device, chosen, choices, now_ns)
        return chosen

    def _most_efficient_if_contended(self, device: DeviceState, chosen: Choice, choices: list[Choice]) -> Choice | None:
        """Past saturation lane time is what is scarce. Deadline order runs every batch at its
        deadline's edge, where only small batches fit and the leftovers become batches of one;
        so when the candidates, one batch each in deadline order, cannot all meet their deadlines,
        run the one that serves the most requests per unit of lane time (``docs/scheduler/overview.md``)."""
        kind = device.kind
        duration = {c.model: c.exec_ns for c in choices}
        finish = chosen.start_ns
        for choice in sorted(choices):
            finish += duration[choice.model]
            if finish > choice.ready_by_ns:
                return max(choices, key=lambda c: (self._efficiency(c, duration[c.model], kind), -c.slack_ns))
        return None  # deadline order serves them all: nothing to trade

    def _efficiency(self, choice: Choice, duration_ns: int, kind: str) -> float:
        """The batch's throughput as a share of its model's best (full batches of the largest size):
        a slow model's full batch is as good a use of the lane as a fast model's."""
        largest = self.state.shapes.sizes(choice.model)[-1]
        best_per_request = self.state.shapes.exec_ns(choice.model, largest, kind) / largest
        return choice.n_requests * best_per_request / max(1, duration_ns)

    def _spare_the_next(self, device: DeviceState, chosen: Choice, choices: list[Choice], now_ns: int) -> Choice:
        """One step of lookahead that Clockwork's bump lacks: if the least-slack batch would
        end too late for the next most urgent model, run that model first when the chosen
        one can afford the wait, else shrink the chosen batch so both make it."""
        kind, fastest_ns = device.kind, self.state.shapes.fastest_ns
        chosen_ns = chosen.exec_ns
        others = [c for c in choices if c.model != chosen.model]
        urgent = min(others, key=lambda c: c.ready_by_ns - fastest_ns(c.model, kind))
        urgent_latest_start = urgent.ready_by_ns - fastest_ns(urgent.model, kind)
        if chosen.start_ns + chosen_ns <= urgent_latest_start:
            return chosen
        if self.config.lookahead_within_share and self.state.demand.over_share(urgent.model, device, now_ns):
            return chosen  # lookahead protects models within their share, not one over-share model from another
        finish_by = min(urgent.ready_by_ns, chosen.ready_by_ns - chosen_ns)
        first = self.batch_within_head(device, urgent.model, urgent.start_ns, finish_by)
        if first is not None:
            return first
        smaller = self.batch_within_head(device, chosen.model, chosen.start_ns, urgent_latest_start)
        return smaller if smaller is not None and smaller.ready_by_ns >= chosen.ready_by_ns else chosen
