"""A device's lane (exec or load) as a policy predicts it: when it frees, from the actions in flight on
it. Shared by every predictive policy (``clockwork``, ``infer4``, ``infer5``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

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
