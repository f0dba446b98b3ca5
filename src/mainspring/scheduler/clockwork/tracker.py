"""Predicted state of each device: when its lanes free up, what it holds, its pages."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from mainspring.protocol import DeviceSpec
from mainspring.scheduler.clockwork.estimator import DecayingRate

NEVER = 1 << 62  # a time later than any run


class LaneTracker:
    """Predicts when one lane becomes free from the actions in flight on it.

    Every result re-anchors the prediction: the remaining actions are replayed from
    the measured end (or from now, for a refusal), so a late or early finish shifts
    everything after it.
    """

    __slots__ = ("_in_flight", "free_ns", "moved")

    def __init__(self) -> None:
        self._in_flight: OrderedDict[int, tuple[int, int]] = OrderedDict()  # action -> (earliest, expected)
        self.free_ns = 0
        self.moved: Callable[[], None] | None = None  # told whenever ``free_ns`` is predicted anew

    def plan(self, action_id: int, start_ns: int, expected_ns: int) -> int:
        """Add an action starting at ``start_ns``; returns its predicted end."""
        self._in_flight[action_id] = (start_ns, expected_ns)
        self.free_ns = start_ns + expected_ns
        if self.moved is not None:
            self.moved()
        return self.free_ns

    def complete(self, action_id: int, anchor_ns: int) -> None:
        """The action ended (or was refused) and the lane was free again at ``anchor_ns``."""
        self._in_flight.pop(action_id, None)
        t = anchor_ns
        for earliest, expected in self._in_flight.values():
            t = max(t, earliest) + expected
        self.free_ns = t
        if self.moved is not None:
            self.moved()

    @property
    def busy(self) -> bool:
        return bool(self._in_flight)


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
