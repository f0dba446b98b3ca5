"""One simulated run: a policy, emulated devices and a workload on a virtual clock."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from mainspring.cells.cost import ProcessCost
from mainspring.controller import Controller
from mainspring.frontend.shedding import target_lag_ns
from mainspring.models.profile import ModelProfile
from mainspring.protocol import Action, ActionResult, DeviceSpec, Request, Response, ResponseStatus
from mainspring.protocol.pages import DEFAULT_PAGE_BYTES, DEFAULT_POOL_BYTES
from mainspring.scheduler.base import Scheduler
from mainspring.scheduler.registry import make_scheduler
from mainspring.scheduler.timed import TimedScheduler
from mainspring.sim.cells import (
    Cell,
    CellsConfig,
    CellsSummary,
    CellWiring,
    Routing,
    make_cells,
    split_devices,
)
from mainspring.sim.collector import fewer_collections
from mainspring.sim.engine import PRIORITY_ARRIVAL, PRIORITY_RESULT, PRIORITY_WAKEUP, DelayedLink, EventLoop, seed_for
from mainspring.sim.frontend import make_frontends
from mainspring.sim.machine import Machine
from mainspring.telemetry.recorder import Recorder, RequestRow
from mainspring.telemetry.report import RunReport, build_report
from mainspring.time import NS_PER_MS, NS_PER_S
from mainspring.worker.runtimes.emulated import EmulatedDevice, NoiseModel
from mainspring.workload.base import MAX_ARRIVALS, Arrival, Workload


@dataclass(frozen=True)
class SimulationConfig:
    """Everything about a run except the policy and the workload."""

    duration_ns: int
    devices: int = 6
    device_kind: str = "v100"
    pool_bytes: int = DEFAULT_POOL_BYTES
    page_bytes: int = DEFAULT_PAGE_BYTES
    slo_ns: int = 100 * NS_PER_MS
    seed: int = 1
    noise: NoiseModel = field(default_factory=NoiseModel)
    drain_ns: int = 30 * NS_PER_S  # after the arrival window: time to finish what is queued
    network_latency_ns: int = 0
    # Arrivals run for warmup_ns + duration_ns; the report counts only those from warmup_ns on, so
    # a short window is measured warm as in a long replay (every model starts cold at time 0).
    warmup_ns: int = 0

    def __post_init__(self) -> None:
        problems = [
            f"{name}={getattr(self, name)} must be positive"
            for name in ("duration_ns", "devices", "slo_ns", "pool_bytes", "page_bytes")
            if getattr(self, name) <= 0
        ]
        problems += [
            f"{name}={getattr(self, name)} must not be negative"
            for name in ("drain_ns", "network_latency_ns", "warmup_ns")
            if getattr(self, name) < 0
        ]
        if problems:
            raise ValueError("bad simulation config: " + "; ".join(problems))

    @property
    def arrival_window_ns(self) -> int:
        """How long arrivals run: the warm-up, then the counted window."""
        return self.warmup_ns + self.duration_ns

    def device_specs(self) -> list[DeviceSpec]:
        return [DeviceSpec(i, self.device_kind, self.pool_bytes, self.page_bytes) for i in range(self.devices)]


@dataclass
class SimulationResult:
    report: RunReport
    recorder: Recorder
    devices: list[EmulatedDevice]
    end_ns: int
    labels: dict[int, str] = field(default_factory=dict)  # request id -> its workload part's label
    cells: CellsSummary | None = None  # with ``simulate(cells=...)``: each cell's controller core, the routing
    # with ``simulate(miss_budget=...)``: the misses counted when the run stopped early (more than the
    # budget; the report then covers only the window up to there), 0 if it ran to the end
    stopped_after_misses: int = 0


ProgressHook = Callable[[int], None]
# Each simulated second: the time and the run's recorders so far (one, or one a cell and the frontends'),
# for a long run to write its results as it goes.
Watcher = Callable[[int, Sequence[Recorder]], None]
SchedulerWrapper = Callable[[Scheduler], Scheduler]  # e.g. to time or trace the policy


class _Arrivals:
    """Feeds a workload's arrivals to a run (follow-ups of closed loops included) and hears its answers."""

    def __init__(self, config: SimulationConfig, workload: Workload) -> None:
        self.loop = EventLoop()
        self.config = config
        self.workload = workload
        self._arrival_of: dict[int, Arrival] = {}
        self.labels: dict[int, str] = {}
        self._next_id = 0
        self._followups = 0
        self._arrivals: Iterator[Arrival] = iter(())
        self.arrivals_done = False

    def submit(self, request: Request) -> None:
        raise NotImplementedError

    @property
    def outstanding(self) -> int:
        raise NotImplementedError

    def start(self, arrivals: Iterable[Arrival]) -> None:
        self._arrivals = iter(arrivals)
        self._schedule_next_arrival()

    def _schedule_next_arrival(self) -> None:
        arrival = next(self._arrivals, None)
        if arrival is None:
            self.arrivals_done = True
        else:
            self.loop.call_at(arrival.time_ns, partial(self._arrive, arrival, True), PRIORITY_ARRIVAL)

    def _arrive(self, arrival: Arrival, from_stream: bool) -> None:
        if from_stream:
            self._schedule_next_arrival()
        else:
            self._followups -= 1
        now = self.loop.now_ns()
        slo = arrival.slo_ns if arrival.slo_ns is not None else self.config.slo_ns
        self._next_id += 1
        self._arrival_of[self._next_id] = arrival
        if arrival.label:
            self.labels[self._next_id] = arrival.label
        # The margin covers the result's trip back: its result is due at the worker that much before its deadline.
        self.submit(Request.arriving(self._next_id, arrival.model, now, slo, self.config.network_latency_ns))

    def _on_answer(self, request: Request, response: Response, output: object) -> None:
        arrival = self._arrival_of.pop(request.id)
        succeeded = response.status is ResponseStatus.SUCCESS
        follow = self.workload.on_answer(arrival, self.loop.now_ns(), succeeded)
        if follow is not None:
            self._followups += 1
            self.loop.call_at(
                max(follow.time_ns, self.loop.now_ns()), partial(self._arrive, follow, False), PRIORITY_ARRIVAL
            )

    def done(self) -> bool:
        return self.arrivals_done and self._followups == 0 and self.outstanding == 0

    def answered(self) -> list[list[RequestRow]]:
        """The rows of the requests answered so far (one list per recorder, each growing in order)."""
        raise NotImplementedError


class _MissCounter:
    """Counts the counted requests that missed their SLO, reading only the rows added since last time."""

    def __init__(self, counted_from_ns: int) -> None:
        self._counted_from_ns = counted_from_ns
        self._read: list[int] = []
        self.missed = 0

    def update(self, answered: list[list[RequestRow]]) -> int:
        self._read += [0] * (len(answered) - len(self._read))
        for index, rows in enumerate(answered):
            new = rows[self._read[index] :]
            self._read[index] = len(rows)
            self.missed += sum(1 for r in new if r.arrival_ns >= self._counted_from_ns and not r.good)
        return self.missed


class _Run(_Arrivals):
    """Wires one controller, its devices and the arrivals onto one event loop."""

    def __init__(
        self,
        policy: str,
        profiles: Sequence[ModelProfile],
        workload: Workload,
        config: SimulationConfig,
        wrap: SchedulerWrapper | None = None,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(config, workload)
        self.recorder = Recorder()
        by_name = {p.model: p for p in profiles}
        specs = config.device_specs()
        self.devices = [
            EmulatedDevice(
                spec, by_name, self.loop, self._result_sink, config.noise, seed_for(config.seed, f"dev{spec.device}")
            )
            for spec in specs
        ]
        rng = random.Random(seed_for(config.seed, "scheduler"))
        # The margin the requests' ``ready_by_ns`` take off, for clockwork's tight-class guard to plan by.
        margin_ns = config.network_latency_ns
        scheduler: Scheduler = make_scheduler(policy, by_name, specs, rng, margin_ns, settings, "--clockwork")
        self.timed = TimedScheduler(scheduler)  # what a controller core pays for this policy, in every report
        scheduler = self.timed if wrap is None else wrap(self.timed)
        links = {d.spec.device: self._link(d) for d in self.devices}
        self.controller = Controller(
            scheduler, self.loop.clock, links, self._on_answer, self._wakeup, self.recorder, defer=self.loop.defer
        )

    def submit(self, request: Request) -> None:
        self.controller.submit(request)

    def answered(self) -> list[list[RequestRow]]:
        return [self.recorder.requests]

    def recorders(self) -> list[Recorder]:
        return [self.recorder]

    def shutdown(self, reason: str) -> None:
        self.controller.shutdown(reason)

    @property
    def policy_cpu_ns(self) -> int:
        return self.timed.cpu_ns

    @property
    def outstanding(self) -> int:
        return self.controller.outstanding

    def _link(self, device: EmulatedDevice) -> DelayedLink:
        return DelayedLink(device.submit, self.loop, self.config.network_latency_ns)

    def _result_sink(self, result: ActionResult) -> None:
        delay = self.config.network_latency_ns
        self.loop.call_at(self.loop.now_ns() + delay, partial(self.controller.deliver, result), PRIORITY_RESULT)

    def _wakeup(self, time_ns: int) -> None:
        self.loop.call_at(time_ns, self.controller.wake, PRIORITY_WAKEUP)


class _CellsRun(_Arrivals):
    """Cells of devices, each behind a controller core of its own, and the routing between them."""

    def __init__(
        self,
        policy: str,
        profiles: Sequence[ModelProfile],
        workload: Workload,
        config: SimulationConfig,
        cells: CellsConfig,
        wrap: SchedulerWrapper | None = None,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(config, workload)
        self._profiles = by_name = {p.model: p for p in profiles}
        wiring = CellWiring(self.loop, cells.cost, wrap, self._answered, Machine(cells.machine))
        self.cells = make_cells(
            policy, by_name, split_devices(config.device_specs(), cells.cells), partial(seed_for, config.seed),
            self._devices, self._links, wiring, config.network_latency_ns, settings,
        )  # fmt: skip
        self.devices = [d for cell in self.cells for d in cell.devices]
        self.routing = Routing(self.cells, by_name, cells)
        self.cells_config = cells
        self._max_lag_ns = cells.max_lag_ns if cells.max_lag_ns is not None else config.slo_ns // 2
        self._retried: set[int] = set()
        self._closing = False
        self.frontends = make_frontends(cells.frontends, self.loop, cells.cost.frontend, config.slo_ns,
                                        lambda: not self.done(), self._route, self._shed, wiring.machine)  # fmt: skip
        for cell in self.cells if cells.cost.process != ProcessCost() else ():  # a live process: sheds as live
            cell.watch(target_lag_ns(config.slo_ns), lambda: not self.done())
        self.loop.call_at(self.routing.planner.next_replan_ns, self._replan, PRIORITY_WAKEUP)
        self.loop.call_at(0, self._signal, PRIORITY_WAKEUP)

    def _devices(self, specs: list[DeviceSpec], sink: Callable[[ActionResult], None]) -> list[EmulatedDevice]:
        config = self.config
        return [
            EmulatedDevice(spec, self._profiles, self.loop, partial(self._result, sink), config.noise,
                           seed_for(config.seed, f"dev{spec.device}"))
            for spec in specs
        ]  # fmt: skip

    def _links(self, devices: list[EmulatedDevice]) -> dict[int, Callable[[Action], None]]:
        return {d.spec.device: DelayedLink(d.submit, self.loop, self.config.network_latency_ns).submit for d in devices}

    def _result(self, sink: Callable[[ActionResult], None], result: ActionResult) -> None:
        self.loop.call_at(self.loop.now_ns() + self.config.network_latency_ns, partial(sink, result), PRIORITY_RESULT)

    def submit(self, request: Request) -> None:
        self.frontends.arrive(request)

    def _route(self, request: Request) -> None:
        now = self.loop.now_ns()
        cell = self.routing.route(request, now)
        lag = cell.core.lag_ns(now)
        if lag > self._max_lag_ns:
            self.frontends.overloaded_elsewhere(request)
            cell.refuse(request, lag, now, self._answered)
        else:
            cell.submit(request)

    def _shed(self, request: Request, response: Response) -> None:
        self._on_answer(request, response, None)

    @property
    def outstanding(self) -> int:
        return sum(cell.outstanding for cell in self.cells) + self.frontends.holding

    def answered(self) -> list[list[RequestRow]]:
        return [cell.recorder.requests for cell in self.cells] + [self.frontends.recorder.requests]

    @property
    def policy_cpu_ns(self) -> int:
        return sum(cell.timed.cpu_ns for cell in self.cells)

    def _answered(self, cell: Cell, request: Request, response: Response, output: object) -> None:
        if self._closing:
            self._answered_out(cell, request, response, output)
        else:  # back through its frontend's core
            self.frontends.answer(request, partial(self._answered_out, cell, request, response, output))

    def _answered_out(self, cell: Cell, request: Request, response: Response, output: object) -> None:
        now = self.loop.now_ns()
        if request.id not in self._retried and not self._closing:
            second = self.routing.second_cell(cell, request, response, now)
            if second is not None:
                self._retried.add(request.id)
                second.submit(request)
                return
        elif response.status is ResponseStatus.SUCCESS:
            self.routing.second_tries_served += 1
        cell.recorder.on_answer(request, response, now)
        self._on_answer(request, response, output)

    def _replan(self) -> None:
        self.routing.replan(self.loop.now_ns())
        if not self.done():
            self.loop.call_at(self.routing.planner.next_replan_ns, self._replan, PRIORITY_WAKEUP)

    def _signal(self) -> None:
        now = self.loop.now_ns()
        for cell in self.cells:
            if self.routing.shared.get(cell.index):
                cell.core.post(partial(self.routing.publish_from, cell, self.loop.now_ns, self._after_delay))
        if not self.done():
            self.loop.call_at(now + self.cells_config.signal_period_ns, self._signal, PRIORITY_WAKEUP)

    def _after_delay(self, publish: Callable[[], None]) -> None:
        self.loop.call_at(self.loop.now_ns() + self.cells_config.signal_delay_ns, publish, PRIORITY_RESULT)

    def shutdown(self, reason: str) -> None:
        self._closing = True  # no second tries from here on
        self.frontends.flush()  # what they hold reaches the cells, or the clients, now
        for cell in self.cells:  # what every last turn decided, before anything is refused
            cell.core.flush()
        for cell in self.cells:
            cell.shutdown(reason, self._answered)

    def recorders(self) -> list[Recorder]:
        return [*(cell.recorder for cell in self.cells), self.frontends.recorder]

    def merged_recorder(self) -> Recorder:
        merged = Recorder()
        for recorder in self.recorders():
            merged.requests.extend(recorder.requests)
            merged.actions.extend(recorder.actions)
            merged.received += recorder.received
        merged.received -= len(self._retried)
        merged.requests.sort(key=lambda row: row.request_id)
        return merged

    def summary(self) -> CellsSummary:
        span = self.loop.now_ns()
        routing = self.routing
        return CellsSummary(
            [cell.row(span) for cell in self.cells], routing.replans, routing.moves,
            sum(1 for cells in routing.placement.values() if len(cells) > 1), routing.router.picks,
            routing.router.second_tries, routing.second_tries_served,
            self.frontends.rows(span),
        )  # fmt: skip


def generate_arrivals(workload: Workload, profiles: Sequence[ModelProfile], config: SimulationConfig) -> list[Arrival]:
    """The arrival sequence for a seed: generate once, replay for every policy. More than
    ``MAX_ARRIVALS`` is a ``ValueError`` (a rate or scale mistyped by orders of magnitude would
    otherwise fill the memory before the first simulated second)."""
    rng = random.Random(seed_for(config.seed, "workload"))
    arrivals = list(itertools.islice(workload.arrivals(profiles, config.arrival_window_ns, rng), MAX_ARRIVALS + 1))
    if len(arrivals) > MAX_ARRIVALS:
        seconds = config.arrival_window_ns / NS_PER_S
        raise ValueError(f"the workload asks for more than {MAX_ARRIVALS:,} requests in {seconds:g} s, more than "
                         "one run holds: lower the rate (or trace scale) or the duration")  # fmt: skip
    return arrivals


def simulate(
    policy: str,
    profiles: Sequence[ModelProfile],
    workload: Workload,
    config: SimulationConfig,
    arrivals: Iterable[Arrival] | None = None,
    progress: ProgressHook | None = None,
    wrap: SchedulerWrapper | None = None,
    settings: Mapping[str, object] | None = None,
    cells: CellsConfig | None = None,
    miss_budget: int | None = None,
    watch: Watcher | None = None,
) -> SimulationResult:
    """Run ``policy`` on ``arrivals`` (default: generated from ``workload``) and report; ``settings``
    change the clockwork policy's defaults (``ClockworkConfig`` field: value). With ``cells``, the
    devices are split into cells, each with a controller core whose CPU time is on the clock. With
    ``miss_budget``, the run stops (checked every simulated second) once more counted requests than
    that have missed their SLO: a search over configurations learns a miss without paying for it.
    ``watch`` reads the recorders each simulated second (it must not change them)."""
    if miss_budget is not None and miss_budget < 0:
        raise ValueError(f"miss_budget must not be negative, got {miss_budget}")
    started = time.perf_counter()
    run: _Run | _CellsRun
    if cells is None:
        run = _Run(policy, profiles, workload, config, wrap, settings)
    else:
        run = _CellsRun(policy, profiles, workload, config, cells, wrap, settings)
    run.start(arrivals if arrivals is not None else generate_arrivals(workload, profiles, config))
    limit = config.arrival_window_ns + config.drain_ns
    step = NS_PER_S
    horizon = 0
    misses = _MissCounter(config.warmup_ns)
    stopped_after = 0
    with fewer_collections():
        while not run.done() and horizon < limit and not stopped_after:
            horizon = min(horizon + step, limit)
            run.loop.run(until_ns=horizon, stop=run.done)
            if progress is not None:
                progress(min(run.loop.now_ns(), config.arrival_window_ns))
            if watch is not None:
                watch(run.loop.now_ns(), run.recorders())
            finished = run.done() or horizon >= limit
            if miss_budget is not None and not finished and misses.update(run.answered()) > miss_budget:
                stopped_after = misses.missed
    run.shutdown("the simulation ended before this request was answered")
    end = run.loop.now_ns()
    recorder = run.recorder if isinstance(run, _Run) else run.merged_recorder()
    report = build_report(
        recorder,
        policy=policy,
        workload=workload.describe(),
        devices=config.devices,
        models=len(profiles),
        duration_ns=config.duration_ns,
        simulated_ns=end,
        counted_from_ns=config.warmup_ns,
        wall_s=time.perf_counter() - started,
        events=run.loop.events_processed,
        labels=run.labels,
        policy_cpu_ns=run.policy_cpu_ns,
    )
    summary = run.summary() if isinstance(run, _CellsRun) else None
    return SimulationResult(report, recorder, run.devices, end, run.labels, summary, stopped_after)
