"""Routing a request to one of its model's cells, from the load signal each cell publishes.

A cell publishes, every few milliseconds, the earliest time a batch of one of each model it serves
could finish there (``CellSignal``). A router picks, among a model's cells, the one whose signal
(corrected by the work the router itself sent there since) finishes first: no question is asked on
the request path. A cell's rejection can be tried once more on another cell whose signal says it
can still meet the deadline (``second_choice``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mainspring.models.profile import ModelProfile


@dataclass(frozen=True)
class Costs:
    """What routing needs to know of a model: its batch of one, its device time per request in a
    full batch (what one more request adds to a cell's lanes), and its load."""

    exec_ns: int
    work_ns: int
    load_ns: int


def routing_costs(profile: ModelProfile) -> Costs:
    work = min(ns // size for size, ns in profile.exec_ns.items())
    return Costs(profile.exec_time_ns(1), work, profile.load_ns)


@dataclass(frozen=True)
class CellSignal:
    cell: int
    at_ns: int  # when the cell computed it
    devices: int
    finish_ns: Mapping[str, int] = field(default_factory=dict)  # model -> earliest end of a batch of one
    cold_start_ns: int = 0  # a model it does not hold: the earliest a load could start
    incarnation: int = 0  # which run of the cell's process (a new value: it was restarted)


class Router:
    """Picks a cell per request from the latest signals (pure: time is passed in)."""

    def __init__(self) -> None:
        self._signals: dict[int, CellSignal] = {}
        self._sent_ns: dict[int, int] = {}  # cell -> device time routed to it since its signal
        self.picks = 0
        self.second_tries = 0

    def publish(self, signal: CellSignal) -> None:
        """A newer signal replaces the cell's last, and what the router added on top of it."""
        known = self._signals.get(signal.cell)
        if known is None or signal.at_ns >= known.at_ns:
            self._signals[signal.cell] = signal
            self._sent_ns[signal.cell] = 0

    def expected_finish_ns(self, cell: int, model: str, now_ns: int, costs: Costs) -> int:
        """When a batch of one of ``model`` could end on ``cell``: its signal (a load first where the cell
        does not hold it), moved on by the work routed there since (spread over its devices), and never
        before ``now_ns`` plus the batch."""
        signal = self._signals.get(cell)
        if signal is None:
            return now_ns + costs.exec_ns
        finish = signal.finish_ns.get(model)
        if finish is None:
            finish = signal.cold_start_ns + costs.load_ns + costs.exec_ns
        return max(finish + self._sent_ns[cell] // signal.devices, now_ns + costs.exec_ns)

    def pick(self, model: str, cells: Sequence[int], now_ns: int, costs: Costs) -> int:
        """The cell of ``cells`` where ``model`` finishes first (the lowest on a tie); the request's work
        is booked there until the cell's next signal."""
        if len(cells) == 1:
            return cells[0]
        self.picks += 1
        chosen = min(cells, key=lambda c: (self.expected_finish_ns(c, model, now_ns, costs), c))
        if chosen in self._sent_ns:
            self._sent_ns[chosen] += costs.work_ns
        return chosen

    def second_choice(
        self, model: str, cells: Sequence[int], tried: int, now_ns: int, deadline_ns: int, costs: Costs
    ) -> int | None:
        """Another cell of ``cells`` whose signal says ``model`` can still end by ``deadline_ns``, or None."""
        others = [c for c in cells if c != tried and c in self._signals]
        if not others:
            return None
        best = min(others, key=lambda c: (self.expected_finish_ns(c, model, now_ns, costs), c))
        if self.expected_finish_ns(best, model, now_ns, costs) > deadline_ns:
            return None
        self.second_tries += 1
        if best in self._sent_ns:
            self._sent_ns[best] += costs.work_ns
        return best
