"""Synthetic workloads: Poisson open loop, bursty on/off, closed loop, SLO sweep."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mainspring.models.profile import ModelProfile
from mainspring.time import NS_PER_MS, NS_PER_S, s_to_ns
from mainspring.workload.base import Arrival, Workload

POPULARITIES = ("uniform", "zipf")


def popularity_weights(count: int, popularity: str, zipf_s: float = 1.0) -> list[float]:
    """Relative request share of ``count`` models: equal, or Zipf (rank^-s, rank 1 most popular)."""
    if popularity == "uniform":
        return [1.0] * count
    if popularity == "zipf":
        return [1.0 / (rank**zipf_s) for rank in range(1, count + 1)]
    raise ValueError(f"unknown popularity {popularity!r}; choose one of {', '.join(POPULARITIES)}")


def poisson_times(rate_rps: float, duration_ns: int, rng: random.Random) -> Iterator[int]:
    """Arrival times (ns) of a Poisson process at ``rate_rps`` until ``duration_ns``."""
    t = 0.0
    rate_per_ns = rate_rps / NS_PER_S
    while True:
        t += rng.expovariate(rate_per_ns)
        if t >= duration_ns:
            return
        yield int(t)


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")


@dataclass
class PoissonOpenLoop(Workload):
    """Poisson arrivals at ``rate_rps`` in total, spread over the models by popularity."""

    rate_rps: float
    popularity: str = "uniform"
    zipf_s: float = 1.0
    name = "poisson"

    def __post_init__(self) -> None:
        _positive("rate_rps", self.rate_rps)
        popularity_weights(1, self.popularity)

    def arrivals(self, models: Sequence[ModelProfile], duration_ns: int, rng: random.Random) -> Iterator[Arrival]:
        weights = popularity_weights(len(models), self.popularity, self.zipf_s)
        cumulative = list(itertools.accumulate(weights))
        names = [m.model for m in models]
        for t in poisson_times(self.rate_rps, duration_ns, rng):
            yield Arrival(t, rng.choices(names, cum_weights=cumulative)[0])

    def expected_arrivals(self, models: int, duration_ns: int) -> float:
        return self.rate_rps * duration_ns / NS_PER_S

    def describe(self) -> str:
        return f"poisson {self.rate_rps:g} r/s, {self.popularity}"


@dataclass
class BurstyOnOff(Workload):
    """Each model alternates exponentially long on and off phases; Poisson at ``rate_rps`` while on."""

    rate_rps: float
    mean_on_s: float = 1.0
    mean_off_s: float = 4.0
    name = "bursty"

    def __post_init__(self) -> None:
        for field_name in ("rate_rps", "mean_on_s", "mean_off_s"):
            _positive(field_name, getattr(self, field_name))

    def _one_model(self, model: str, duration_ns: int, rng: random.Random) -> list[Arrival]:
        arrivals = []
        t = rng.uniform(0, self.mean_off_s) * NS_PER_S
        rate_per_ns = self.rate_rps / NS_PER_S
        while t < duration_ns:
            on_end = t + rng.expovariate(1 / self.mean_on_s) * NS_PER_S
            t += rng.expovariate(rate_per_ns)
            while t < min(on_end, duration_ns):
                arrivals.append(Arrival(int(t), model))
                t += rng.expovariate(rate_per_ns)
            t = on_end + rng.expovariate(1 / self.mean_off_s) * NS_PER_S
        return arrivals

    def arrivals(self, models: Sequence[ModelProfile], duration_ns: int, rng: random.Random) -> Iterator[Arrival]:
        per_model = [self._one_model(m.model, duration_ns, random.Random(rng.getrandbits(64))) for m in models]
        return heapq.merge(*per_model, key=lambda a: a.time_ns)

    def expected_arrivals(self, models: int, duration_ns: int) -> float:
        on_share = self.mean_on_s / (self.mean_on_s + self.mean_off_s)
        return models * self.rate_rps * on_share * duration_ns / NS_PER_S

    def describe(self) -> str:
        return f"bursty {self.rate_rps:g} r/s per model while on ({self.mean_on_s:g} s on / {self.mean_off_s:g} s off)"


@dataclass
class ClosedLoop(Workload):
    """``clients`` clients, each keeping ``outstanding`` requests in flight to its own model.

    After a failed or rejected request a client waits ``backoff_s`` before the next one,
    as a real client would (an immediate retry of an immediate rejection never ends).
    """

    clients: int
    outstanding: int = 1
    think_s: float = 0.0
    backoff_s: float = 0.01
    name = "closed"

    def __post_init__(self) -> None:
        _positive("clients", self.clients)
        _positive("outstanding", self.outstanding)
        if self.think_s < 0:
            raise ValueError(f"think_s must not be negative, got {self.think_s}")
        _positive("backoff_s", self.backoff_s)
        self._end_ns = 0

    def arrivals(self, models: Sequence[ModelProfile], duration_ns: int, rng: random.Random) -> Iterator[Arrival]:
        self._end_ns = duration_ns
        for client in range(self.clients):
            model = models[client % len(models)].model
            for _ in range(self.outstanding):
                yield Arrival(0, model)

    def expected_arrivals(self, models: int, duration_ns: int) -> float:
        """At most: every request answered at once, each client sending again after its pause (a
        refused one's ``backoff_s``: an overloaded run is this loop's busiest)."""
        pause_s = max(self.think_s, self.backoff_s)
        return self.clients * self.outstanding * (1 + duration_ns / NS_PER_S / pause_s)

    def on_answer(self, arrival: Arrival, answered_ns: int, succeeded: bool) -> Arrival | None:
        next_ns = answered_ns + s_to_ns(self.think_s if succeeded else max(self.think_s, self.backoff_s))
        return Arrival(next_ns, arrival.model, arrival.slo_ns, arrival.label) if next_ns < self._end_ns else None

    @property
    def closed_loop(self) -> bool:
        return True

    def describe(self) -> str:
        return f"closed loop, {self.clients} clients x {self.outstanding} outstanding"


@dataclass
class SloSweep(Workload):
    """Wraps a workload; every ``interval_s`` the SLO grows by ``growth``, as in Clockwork's Fig. 7.

    The SLO of a request is ``factor x`` the unit, starting at ``start_factor`` and capped at
    ``max_factor``. The unit is ``unit_ms`` where given (the authors' README gives 2.9 ms for
    resnet50_v2), else the request's model's batch-1 exec time in its profile.
    """

    inner: Workload
    start_factor: float = 1.0
    growth: float = 1.5
    interval_s: float = 10.0
    max_factor: float = 100.0
    unit_ms: float | None = None
    name = "slo-sweep"

    def __post_init__(self) -> None:
        for field_name in ("start_factor", "interval_s", "max_factor"):
            _positive(field_name, getattr(self, field_name))
        if self.growth < 1:
            raise ValueError(f"growth must be at least 1, got {self.growth}")
        if self.unit_ms is not None:
            _positive("unit_ms", self.unit_ms)
        self._by_name: dict[str, ModelProfile] = {}

    def factor_at(self, time_ns: int) -> float:
        steps = time_ns // max(1, s_to_ns(self.interval_s))
        if self.growth > 1:  # past the cap the power only overflows (100 ** 1000 steps did)
            steps = min(steps, math.ceil(math.log(max(self.max_factor / self.start_factor, 1), self.growth)) + 1)
        return min(self.max_factor, self.start_factor * self.growth**steps)

    def arrivals(self, models: Sequence[ModelProfile], duration_ns: int, rng: random.Random) -> Iterator[Arrival]:
        self._by_name = {m.model: m for m in models}
        for arrival in self.inner.arrivals(models, duration_ns, rng):
            yield self._with_slo(arrival)

    def expected_arrivals(self, models: int, duration_ns: int) -> float | None:
        return self.inner.expected_arrivals(models, duration_ns)

    def slo_ns_at(self, time_ns: int, profile: ModelProfile) -> int:
        """The SLO of a request of ``profile``'s model arriving at ``time_ns``."""
        factor = self.factor_at(time_ns)
        if self.unit_ms is None:
            return profile.slo_ns_for_factor(factor)
        return math.ceil(factor * self.unit_ms * NS_PER_MS)

    def _with_slo(self, arrival: Arrival) -> Arrival:
        slo = self.slo_ns_at(arrival.time_ns, self._by_name[arrival.model])
        return Arrival(arrival.time_ns, arrival.model, slo, arrival.label)

    def on_answer(self, arrival: Arrival, answered_ns: int, succeeded: bool) -> Arrival | None:
        follow = self.inner.on_answer(arrival, answered_ns, succeeded)
        return None if follow is None else self._with_slo(follow)  # a closed loop's next request: today's SLO

    @property
    def closed_loop(self) -> bool:
        return self.inner.closed_loop

    def describe(self) -> str:
        steps = f"x{self.growth:g} every {self.interval_s:g} s"
        unit = "" if self.unit_ms is None else f" of {self.unit_ms:g} ms"
        return f"SLO sweep x{self.start_factor:g}..x{self.max_factor:g}{unit} ({steps}) over {self.inner.describe()}"
