"""Workloads built from parts: fixed rates, progressive activation, and labelled compositions.

These drive the reproduction of Clockwork's evaluation (``benchmarks/paper/``): Fig. 6
activates one more model every second; Fig. 8 mixes latency-sensitive models at a fixed
rate under a ramped SLO with closed-loop batch clients under a relaxed one, and reports
each class apart (its label).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from mainspring.models.profile import ModelProfile
from mainspring.time import NS_PER_S
from mainspring.workload.base import Arrival, Workload
from mainspring.workload.generators import poisson_times


@dataclass
class FixedRate(Workload):
    """Every model receives exactly ``rate_rps`` requests per second, evenly spaced, from a random phase."""

    rate_rps: float
    name = "fixed-rate"

    def __post_init__(self) -> None:
        if not self.rate_rps > 0:
            raise ValueError(f"rate_rps must be positive, got {self.rate_rps}")

    def arrivals(self, models: Sequence[ModelProfile], duration_ns: int, rng: random.Random) -> Iterator[Arrival]:
        interval = NS_PER_S / self.rate_rps
        streams = []
        for m in models:
            phase = rng.uniform(0, interval)
            count = int((duration_ns - phase) // interval) + 1 if phase < duration_ns else 0
            streams.append([Arrival(int(phase + i * interval), m.model) for i in range(count)])
        return heapq.merge(*streams, key=lambda a: a.time_ns)

    def describe(self) -> str:
        return f"fixed rate {self.rate_rps:g} r/s per model"


@dataclass
class ProgressiveActivation(Workload):
    """Poisson arrivals at ``rate_rps`` in total, spread evenly over the models active so far:
    ``initial`` at ``start_s``, one more every ``interval_s`` (Clockwork's Fig. 6 "major" models,
    which start after the minor model ran alone for a lead-in). A uniform pick of the active model per
    arrival is the same as a Poisson process per model at ``rate_rps / active``."""

    rate_rps: float
    initial: int = 1
    interval_s: float = 1.0
    start_s: float = 0.0
    name = "progressive"

    def __post_init__(self) -> None:
        if not self.rate_rps > 0 or self.initial < 1 or not self.interval_s > 0 or self.start_s < 0:
            raise ValueError(
                f"progressive activation needs rate_rps > 0, initial >= 1, interval_s > 0, start_s >= 0; "
                f"got {self.rate_rps}, {self.initial}, {self.interval_s}, {self.start_s}"
            )

    def active_at(self, time_ns: int, n_models: int) -> int:
        """Models active at ``time_ns`` (0 before ``start_s``)."""
        since = time_ns - int(self.start_s * NS_PER_S)  # integers: an arrival at the start is active
        if since < 0:
            return 0
        return min(n_models, self.initial + int(since // (self.interval_s * NS_PER_S)))

    def arrivals(self, models: Sequence[ModelProfile], duration_ns: int, rng: random.Random) -> Iterator[Arrival]:
        start = int(self.start_s * NS_PER_S)
        for t in poisson_times(self.rate_rps, max(0, duration_ns - start), rng):
            t += start
            yield Arrival(t, models[rng.randrange(self.active_at(t, len(models)))].model)

    def describe(self) -> str:
        start = f" from {self.start_s:g} s" if self.start_s else ""
        return f"{self.rate_rps:g} r/s over {self.initial}+1 per {self.interval_s:g} s active models{start}"


@dataclass
class Part:
    """One labelled part of a ``Composition``: a workload over the named models, with its own SLO
    (None: the run's default; a workload that sets SLOs itself, such as ``SloSweep``, keeps them)."""

    label: str
    workload: Workload
    models: tuple[str, ...]
    slo_ns: int | None = None


@dataclass
class Composition(Workload):
    """Several labelled workloads side by side, each over its own models."""

    parts: list[Part]
    name = "composition"
    _by_label: dict[str, Part] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        labels = [p.label for p in self.parts]
        if not self.parts or len(set(labels)) != len(labels) or any(not label for label in labels):
            raise ValueError(f"a composition needs parts with distinct, non-empty labels; got {labels}")
        self._by_label = {p.label: p for p in self.parts}

    def arrivals(self, models: Sequence[ModelProfile], duration_ns: int, rng: random.Random) -> Iterator[Arrival]:
        by_name = {m.model: m for m in models}
        streams = []
        for part in self.parts:
            missing = [m for m in part.models if m not in by_name]
            if missing or not part.models:
                raise ValueError(f"part {part.label!r} names models the run does not have: {missing[:3]}")
            subset = [by_name[m] for m in part.models]
            own_rng = random.Random(rng.getrandbits(64))
            streams.append(self._labelled(part, part.workload.arrivals(subset, duration_ns, own_rng)))
        return heapq.merge(*streams, key=lambda a: a.time_ns)

    @staticmethod
    def _labelled(part: Part, arrivals: Iterator[Arrival]) -> Iterator[Arrival]:
        for a in arrivals:
            yield Arrival(a.time_ns, a.model, a.slo_ns if a.slo_ns is not None else part.slo_ns, part.label)

    def on_answer(self, arrival: Arrival, answered_ns: int, succeeded: bool) -> Arrival | None:
        part = self._by_label[arrival.label]
        follow = part.workload.on_answer(arrival, answered_ns, succeeded)
        if follow is None:
            return None
        slo = follow.slo_ns if follow.slo_ns is not None else part.slo_ns
        return Arrival(follow.time_ns, follow.model, slo, part.label)

    @property
    def closed_loop(self) -> bool:
        return any(part.workload.closed_loop for part in self.parts)

    def describe(self) -> str:
        return " + ".join(f"{p.label}: {p.workload.describe()}" for p in self.parts)
