"""Arrivals and the workload interface every generator implements."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mainspring.models.profile import ModelProfile

# The most requests one run (simulated or driven live) may ask for: about 2 GB of arrivals or records.
# A 10-minute Azure replay at 680 r/s is 0.4 M, a million-request run 1 M.
MAX_ARRIVALS = 20_000_000


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request to be made: when, to which model, with which SLO (None: the run's default),
    and a label naming the part of a composed workload it belongs to (reports break down by it)."""

    time_ns: int
    model: str
    slo_ns: int | None = None
    label: str = ""


class Workload:
    """Open-loop arrivals (``arrivals``) and, for closed loops, follow-ups (``on_answer``).

    ``arrivals`` must yield in non-decreasing time order and be a pure function of
    its arguments, so that every policy in a run sees the identical sequence.
    """

    name = "workload"

    def arrivals(self, models: Sequence[ModelProfile], duration_ns: int, rng: random.Random) -> Iterator[Arrival]:
        raise NotImplementedError

    def expected_arrivals(self, models: int, duration_ns: int) -> float | None:
        """About how many arrivals ``arrivals`` yields for ``models`` models over ``duration_ns``, found
        without generating them (a mistyped rate is told at once); None where not known."""
        return None

    def on_answer(self, arrival: Arrival, answered_ns: int, succeeded: bool) -> Arrival | None:
        """The next arrival caused by this answer (closed loop); None for open loops."""
        return None

    @property
    def closed_loop(self) -> bool:
        """Whether answers cause further arrivals (``on_answer``): then ``arrivals`` is not all of them.
        A workload that overrides ``on_answer`` is taken to be closed unless it says otherwise."""
        return type(self).on_answer is not Workload.on_answer

    def describe(self) -> str:
        return self.name
