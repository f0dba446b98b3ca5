"""What the clockwork policy's parts read and share: one ``PolicyState`` instead of sibling arguments.

Admission, the batch planner, the load planner and evictions, the strand check and the tight-class
guard each take the state (and, where they need one, another part): where weights are
(``residency``), the queues, the estimates and the batch shapes built on them, the recent demand,
the configuration and the page count of a model on a device. Two steps more than one part takes
live here too, so that no part calls back into the policy: closing a model's queue once it is
empty, and giving up on a queue's head no holder can serve any more (``feasible_head``). The
policy answers the given-up requests (``take_given_up``): answering is its business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from mainspring.models.profile import ModelProfile
from mainspring.protocol import CPU_KIND, DeviceSpec, Request
from mainspring.scheduler.clockwork.config import ClockworkConfig
from mainspring.scheduler.clockwork.demand import RecentDemand
from mainspring.scheduler.clockwork.queues import ModelQueue, RequestQueues
from mainspring.scheduler.clockwork.residency import Residency
from mainspring.scheduler.clockwork.shapes import BatchShapes
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.estimator import Estimator
from mainspring.scheduler.lanes import NEVER
from mainspring.time import ms_to_ns

PageCount = Callable[[str, DeviceSpec], int]  # pages a model occupies on a device of this spec


class PolicyState:
    """The state the clockwork policy's parts read: built once per policy, from its profiles, devices
    and configuration."""

    def __init__(
        self,
        profiles: Mapping[str, ModelProfile],
        devices: Sequence[DeviceSpec],
        config: ClockworkConfig,
        pages_of: PageCount,
    ) -> None:
        self.config = config
        self.profiles = profiles  # the policy's own mapping: models come and go
        self.estimator = self._estimator(config.estimate_percentile_cpu)
        self.shapes = BatchShapes(profiles, self.estimator, config.max_batch_size, config.monotone_estimates)
        self.judged = self.shapes  # what admission judges by: its own with ``admission_percentile_cpu``
        if config.admission_percentile_cpu is not None:
            judge = self._estimator(config.admission_percentile_cpu)
            self.estimator.feed(judge)
            self.judged = BatchShapes(profiles, judge, config.max_batch_size, config.monotone_estimates)
        self.residency = Residency(list(devices), ms_to_ns(config.rate_memory_ms))
        self.queues = RequestQueues()
        self.demand = RecentDemand(config, self.residency, self.judged)
        self._pages_of = pages_of
        self._given_up: list[Request] = []  # heads no holder could serve, for the policy to answer
        self.queue_closed_listeners: list[Callable[[str], None]] = []  # told of each model whose queue closed

    def _estimator(self, cpu_percentile: float) -> Estimator:
        config = self.config
        max_age = None if config.estimate_max_age_s is None else ms_to_ns(config.estimate_max_age_s * 1000)
        suspect = None if config.probe_after_ms is None else ms_to_ns(config.probe_after_ms)
        return Estimator(
            self.profiles,
            config.estimate_window,
            config.estimate_percentile,
            max_age_ns=max_age,
            kind_percentiles={CPU_KIND: cpu_percentile},
            suspect_age_ns=suspect,
        )

    def pages_on(self, model: str, device: DeviceState) -> int:
        """Pages ``model`` occupies on ``device``."""
        return self._pages_of(model, device.spec)

    def fastest_anywhere(self, model: str) -> int:
        """``model``'s fastest batch on the fastest kind of device."""
        return min(self.shapes.fastest_ns(model, kind) for kind in self.residency.kinds)

    def enqueue(self, request: Request) -> None:
        """Queue ``request`` until the last moment its fastest batch could start on any device."""
        expires = request.ready_by_ns - self.fastest_anywhere(request.model) + 1
        after = self.config.spill_after
        strands = None if after is None else request.arrival_ns + int(after * request.slo_ns) + 1
        if self.queues.push(request, expires, strands):
            self.residency.queue_opened(request.model)

    def close_if_empty(self, model: str) -> None:
        """Close ``model``'s queue if it is empty, and tell those who keep per-queue state."""
        if self.queues.close_if_empty(model):
            self.residency.queue_closed(model)
            for listener in self.queue_closed_listeners:
                listener(model)
            self.demand.needs_replica.discard(model)

    def give_up(self, request: Request, now_ns: int) -> None:
        """``request``, taken from its queue, can no longer meet its deadline: its holders count it as
        expired, and the policy answers it (``take_given_up``)."""
        self._given_up.append(request)
        holders = self.residency.holding(request.model)
        for device in holders:
            device.expired.add(1.0 / len(holders), now_ns)

    def take_given_up(self) -> list[Request]:
        """The requests given up since the last call, in the order they were."""
        given_up, self._given_up = self._given_up, []
        return given_up

    def feasible_head(self, queue: ModelQueue, now_ns: int) -> Request | None:
        """The most urgent request that some holder can still serve; gives up on the ones none can."""
        while True:
            head = queue.head()
            if head is None:
                self.close_if_empty(queue.model)
                return None
            if self.earliest_completion(queue.model, now_ns) <= head.ready_by_ns:
                return head
            queue.pop()
            self.give_up(head, now_ns)

    def earliest_completion(self, model: str, now_ns: int) -> int:
        """Best case over devices: on a holder as soon as its lane frees, else after a cold load."""
        best = NEVER
        kind, fastest = "", 0  # holders are mostly of one kind: estimate once per run of a kind
        shapes = self.shapes
        for d in self.residency.holding(model):
            if d.kind != kind:
                kind, fastest = d.kind, shapes.fastest_ns(model, d.kind)
            best = min(best, max(now_ns, d.exec_lane.free_ns, d.ready_ns[model]) + fastest)
        if best == NEVER:
            for d in self.residency.devices:
                ready = max(now_ns, d.load_lane.free_ns) + self.estimator.load_ns(model, d.kind)
                best = min(best, max(ready, d.exec_lane.free_ns) + shapes.fastest_ns(model, d.kind))
        return best
