"""Capacity planning: the fewest devices, then the smallest weight pool, that meet an attainment target.

Every candidate is a deterministic simulation of the real policy on one arrival sequence (generated
once, the same for every candidate), so the same inputs give the same plan. The search is bounded:
devices double from one until the target is met (at most ``max_devices``), then a binary search
between the last miss and the first hit finds the fewest. The pool is then searched the same way in
pages, up from the largest model, to within ``POOL_PRECISION`` of the answer or one page (each finer
step costs a full simulation). Attainment is taken to grow with devices and pool (more of either
never turns a served request away); a search over a non-monotone stretch still returns a
configuration it measured to meet the target, and its neighbours show the margin.

The doubling gives up, with no plan and the reason, where no number of devices can help: when the
requests whose model takes longer than their SLO at batch 1 are more than the target allows, and
when a doubling of the devices gains less than ``FLAT`` attainment (both run to the end; a cheap
sign, both stopped early at the same simulated second, decides when to look).

A candidate that misses is stopped as soon as more requests have missed than the target allows (on
an open-loop workload, whose arrivals are all known up front): its attainment is then an upper
bound, which is all the search needs. The margin's points are run to the end.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from mainspring.cells.placement import Placement, demand_of
from mainspring.cells.placement import plan as place
from mainspring.cells.planner import capacity_of_specs
from mainspring.models.profile import ModelProfile
from mainspring.sim.cells import split_devices
from mainspring.sim.run import SimulationConfig, generate_arrivals, simulate
from mainspring.workload import Arrival, Workload

POOL_PRECISION = 1 / 32  # the pool search stops once the last miss is within this share of the first hit
FLAT = 0.0001  # attainment gained by doubling the devices below this (0.01 points): more devices stopped helping


@dataclass(frozen=True)
class PlanPoint:
    """One simulated configuration and what it measured."""

    devices: int
    pool_bytes: int
    attainment: float  # where not ``complete``: at most this
    goodput_rps: float | None  # None where not ``complete``
    p99_ms: float | None
    busy: float | None
    requests: int
    complete: bool = True  # False: stopped once it could no longer meet the target
    stopped_ns: int | None = None  # where not ``complete``: the simulated time it stopped at

    def meets(self, target: float) -> bool:
        return self.complete and self.attainment >= target


@dataclass(frozen=True)
class Plan:
    """The answer: ``devices`` and ``pool_bytes`` (None where no candidate met the target), with every
    point simulated on the way (the margin: one device fewer and one more are among them)."""

    target: float
    devices: int | None
    pool_bytes: int | None
    points: tuple[PlanPoint, ...]
    reason: str = ""  # with no plan: why more devices would not help, where that is known

    def point(self, devices: int, pool_bytes: int) -> PlanPoint | None:
        return next((p for p in self.points if (p.devices, p.pool_bytes) == (devices, pool_bytes)), None)

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "devices": self.devices,
            "pool_bytes": self.pool_bytes,
            "points": [asdict(p) for p in self.points],
        } | ({"reason": self.reason} if self.reason else {})


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is made from besides the profiles, as plain data (``mainspring plan`` converts its
    options once); a what-if is a copy with one input changed (``with_slo``, ``scaled``)."""

    workload: str  # azure, poisson, bursty, closed or slo-sweep; the next nine fields are its parameters
    trace: Path | None
    trace_scale: float
    trace_start_minute: int
    rate: float
    popularity: str
    clients: int
    outstanding: int
    sweep_growth: float
    sweep_interval_s: float
    slo_ms: float
    duration_s: float
    seed: int
    noise: str
    attainment: float  # the target, in percent
    max_devices: int
    device_memory_gib: float
    page_mib: int
    cell_devices: int

    def with_slo(self, slo_ms: float) -> PlanInputs:
        return replace(self, slo_ms=slo_ms)

    def scaled(self, factor: float) -> PlanInputs:
        """The same workload with ``factor`` times the load: the trace's scale, the clients, or the rate."""
        if self.workload == "azure":
            return replace(self, trace_scale=self.trace_scale * factor)
        if self.workload == "closed":
            return replace(self, clients=max(1, round(self.clients * factor)))
        return replace(self, rate=self.rate * factor)


Progress = Callable[[PlanPoint], None]


class PlanError(ValueError):
    """Inputs no plan can be made from; the message names the input."""


def plan(
    profiles: Sequence[ModelProfile],
    workload: Workload,
    config: SimulationConfig,
    target: float,
    max_devices: int,
    policy: str = "clockwork",
    progress: Progress | None = None,
    arrivals: list[Arrival] | None = None,
) -> Plan:
    """The fewest devices (up to ``max_devices``) of ``config``'s pool that reach ``target`` attainment
    on ``workload``, then the smallest pool (in pages) that still does on that many devices; every
    candidate replays ``arrivals`` (default: generated from ``workload``)."""
    check(profiles, config, target, max_devices)
    if arrivals is None:
        arrivals = generate_arrivals(workload, profiles, config)
    if not arrivals:
        raise PlanError("the workload has no requests in the window: nothing to plan for (--duration-s, --rate)")
    measured: dict[tuple[int, int], PlanPoint] = {}
    counted = sum(1 for a in arrivals if a.time_ns >= config.warmup_ns)
    if (reachable := _reachable_share(profiles, arrivals, config)) < target:
        why = (f"at most {reachable:.4%} of the requests can meet their SLO (the rest are for models slower than it "
               f"at batch 1): no number of devices reaches {target:.4%}")  # fmt: skip
        return Plan(target, None, None, (), why)
    budget = None if workload.closed_loop else _misses_allowed(counted, target)

    def measure(devices: int, pool_bytes: int, to_the_end: bool = False) -> PlanPoint:
        key = (devices, pool_bytes)
        if key not in measured or (to_the_end and not measured[key].complete):
            candidate = replace(config, devices=devices, pool_bytes=pool_bytes)
            measured[key] = _measure(
                policy, profiles, workload, candidate, arrivals, counted, None if to_the_end else budget
            )
            if progress is not None:
                progress(measured[key])
        return measured[key]

    full = config.pool_bytes
    try:
        devices, _ = _fewest(_doubling_check(measure, full, target), 1, max_devices)
    except _FlatError as flat:
        return Plan(target, None, None, tuple(measured.values()), str(flat))
    if devices is None:
        measure(max_devices, full, to_the_end=True)  # the best there is, in full
        return Plan(target, None, None, tuple(measured.values()))
    for neighbour in (devices - 1, devices + 1):  # the margin either side
        if 1 <= neighbour <= max_devices:
            measure(neighbour, full, to_the_end=True)
    page = config.page_bytes
    smallest_pages = max(1, *(math.ceil(p.weights_bytes / page) for p in profiles))  # a pool has a page at least
    pages, below = _fewest(
        lambda k: measure(devices, k * page).meets(target), smallest_pages, full // page, POOL_PRECISION
    )
    pool = full if pages is None else pages * page
    if pages is not None and below >= smallest_pages:
        measure(devices, below * page, to_the_end=True)  # the largest pool that missed: the pool's margin
    return Plan(target, devices, pool, tuple(sorted(measured.values(), key=lambda p: (p.devices, p.pool_bytes))))


class _FlatError(Exception):
    """Doubling the devices stopped helping; the message says by how much."""


def _doubling_check(measure: Callable[..., PlanPoint], full: int, target: float) -> Callable[[int], bool]:
    """``ok(n)`` for the device search: whether ``n`` devices meet ``target``. Before any count has met
    it, raises ``_FlatError`` where ``n`` devices reach less than ``FLAT`` more than half as many did."""
    seen: list[PlanPoint] = []  # as first measured (a point run to the end later replaces it in ``measure``)

    def ok(devices: int) -> bool:
        point = measure(devices, full)
        last = seen[-1] if seen else None
        seen.append(point)
        if point.meets(target):
            return True
        if last is None or last.meets(target) or last.devices >= devices:
            return False  # the first count, or the bisection after a hit: no doubling to judge
        if point.attainment - last.attainment >= FLAT or point.stopped_ns != last.stopped_ns:
            return False  # got further with more devices (stopped early: a bound, at the same second only)
        fewer, more = measure(last.devices, full, to_the_end=True), measure(devices, full, to_the_end=True)
        if more.attainment - fewer.attainment < FLAT:
            raise _FlatError(
                f"more devices stopped helping: {fewer.devices} reach {fewer.attainment:.4%}, {more.devices} reach "
                f"{more.attainment:.4%}, short of {target:.4%} (a longer SLO or faster models would)"
            )
        return False

    return ok


def _reachable_share(profiles: Sequence[ModelProfile], arrivals: Sequence[Arrival], config: SimulationConfig) -> float:
    """The share of the counted arrivals whose model's batch-1 time is within their SLO: the most any
    number of devices can serve in time."""
    fastest = {p.model: min(p.exec_ns.values()) for p in profiles}
    counted = [a for a in arrivals if a.time_ns >= config.warmup_ns]
    slo = config.slo_ns
    reachable = sum(1 for a in counted if fastest.get(a.model, 0) < (slo if a.slo_ns is None else a.slo_ns))
    return reachable / len(counted) if counted else 1.0


def _misses_allowed(counted: int, target: float) -> int:
    """The most misses among ``counted`` requests that still meet ``target``, by the same division
    ``PlanPoint.meets`` makes (a product alone can round the other way at the edge)."""
    allowed = math.floor((1 - target) * counted)
    while allowed < counted and (counted - allowed - 1) / counted >= target:
        allowed += 1
    while allowed > 0 and (counted - allowed) / counted < target:
        allowed -= 1
    return allowed


def _fewest(ok: Callable[[int], bool], low: int, high: int, precision: float = 0.0) -> tuple[int | None, int]:
    """The smallest ``n`` in [low, high] with ``ok(n)``, by doubling from ``low`` then bisecting, and
    the largest ``n`` tried below it that failed (``low - 1`` if none). With ``precision``, the
    bisection stops once the two are within that share of the answer (or one) apart."""
    if high < low:
        return None, low - 1
    last_miss, n = low - 1, low
    while not ok(n):
        last_miss = n
        if n >= high:
            return None, last_miss
        n = min(high, max(n + 1, 2 * n))
    first_hit = n
    while first_hit - last_miss > max(1, math.floor(first_hit * precision)):
        middle = (first_hit + last_miss) // 2
        if ok(middle):
            first_hit = middle
        else:
            last_miss = middle
    return first_hit, last_miss


def _measure(
    policy: str,
    profiles: Sequence[ModelProfile],
    workload: Workload,
    config: SimulationConfig,
    arrivals: list[Arrival],
    counted: int,
    budget: int | None,
) -> PlanPoint:
    """Simulate one configuration; with ``budget``, stop once more requests than that have missed."""
    result = simulate(policy, list(profiles), workload, config, arrivals, miss_budget=budget)
    if result.stopped_after_misses:
        bound = 1 - result.stopped_after_misses / max(counted, 1)
        return PlanPoint(config.devices, config.pool_bytes, bound, None, None, None, counted, False, result.end_ns)
    report = result.report
    return PlanPoint(
        devices=config.devices,
        pool_bytes=config.pool_bytes,
        attainment=report.slo_attainment,
        goodput_rps=report.goodput_rps,
        p99_ms=report.latency_ms.get("p99", float("nan")),
        busy=report.device_busy,
        requests=report.requests,
    )


def check(profiles: Sequence[ModelProfile], config: SimulationConfig, target: float, max_devices: int) -> None:
    if not profiles:
        raise PlanError("no model profiles to plan for")
    if not 0 < target <= 1:
        raise PlanError(f"--attainment must lie in (0, 100] percent, got {target * 100:g}")
    if max_devices < 1:
        raise PlanError(f"--max-devices must be at least 1, got {max_devices}")
    fastest = min(min(p.exec_ns.values()) for p in profiles)
    if config.slo_ns <= fastest:
        raise PlanError(
            f"--slo-ms {config.slo_ns / 1e6:g} is below every model's batch-1 time (the fastest takes "
            f"{fastest / 1e6:g} ms): no number of devices meets it"
        )
    largest = max(p.weights_bytes for p in profiles)
    if largest > config.pool_bytes:
        raise PlanError(
            f"--device-memory-gib {config.pool_bytes / 2**30:g} holds no copy of the largest model "
            f"({largest / 2**30:.2f} GiB)"
        )


def cells_of_plan(
    result: Plan,
    profiles: Sequence[ModelProfile],
    config: SimulationConfig,
    arrivals: Sequence[Arrival],
    cell_devices: int,
) -> Placement:
    """Which cells serve each model on the planned devices and pool ({} without a plan): the cells of at
    most ``cell_devices`` the devices make, as even as can be (as ``simulate --cells`` splits them),
    placed by the cells' planner on the rates ``arrivals`` asked for."""
    if result.devices is None or result.pool_bytes is None:
        return {}
    seconds = config.duration_ns / 1e9
    rates = {model: count / seconds for model, count in Counter(a.model for a in arrivals).items()}
    specs = replace(config, devices=result.devices, pool_bytes=result.pool_bytes).device_specs()
    groups = split_devices(specs, math.ceil(len(specs) / cell_devices))
    cells = [capacity_of_specs(i, group) for i, group in enumerate(groups)]
    return place(cells, [demand_of(p, rates.get(p.model, 0.0)) for p in profiles])
