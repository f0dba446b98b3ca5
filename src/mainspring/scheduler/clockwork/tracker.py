"""Predicted state of each device: its lanes (``scheduler/lanes.py``), what it holds, its pages."""

from __future__ import annotations

from collections import OrderedDict

from mainspring.protocol import DeviceSpec
from mainspring.scheduler.estimator import DecayingRate
from mainspring.scheduler.lanes import LaneTracker


class DeviceState:
    """The controller's view of one device; the worker's page accounting, replayed."""

    def __init__(self, spec: DeviceSpec, rate_memory_ns: int, order: int = 0) -> None:
        self.spec = spec
        self.order = order  # position among the devices, in the order they were added
        self.removed = False
        self.demand = DecayingRate(rate_memory_ns)  # share of this device recent arrivals asked for
        self.expired = DecayingRate(rate_memory_ns)  # requests of its models that expired in queue, recently
        self.served = DecayingRate(rate_memory_ns)  # requests it served, recently
        self.kind = spec.kind
        self.exec_lane = LaneTracker()
        self.load_lane = LaneTracker()
        self.free_pages = spec.total_pages
        self.ready_ns: dict[str, int] = {}  # held models -> when their weights are (predicted) usable
        self.generation: dict[str, int] = {}  # held models -> their residency generation (``Residency``)
        self.loading: set[str] = set()  # held models whose load has not reported yet
        self.last_used: OrderedDict[str, int] = OrderedDict()  # held models, least recently used first
        self.pinned: dict[str, int] = {}  # models with infers or loads in flight -> count
        self.waiting: set[str] = set()  # held models that have queued requests

    def shedding(self, now_ns: int, share: float) -> bool:
        """Has more than ``share`` of the recent work for this device expired in the queues?"""
        expired = self.expired.value(now_ns)
        return expired > share * (expired + self.served.value(now_ns))

    def holds(self, model: str) -> bool:
        return model in self.ready_ns

    def pin(self, model: str) -> None:
        self.pinned[model] = self.pinned.get(model, 0) + 1

    def unpin(self, model: str) -> None:
        count = self.pinned[model] - 1
        if count > 0:
            self.pinned[model] = count
        else:
            del self.pinned[model]

    def touch(self, model: str, now_ns: int) -> None:
        self.last_used[model] = now_ns
        self.last_used.move_to_end(model)
