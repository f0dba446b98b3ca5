"""A simulated run over cells: devices split into groups, each planned by a controller core of its own.

Each cell runs the unchanged policy over its own devices behind a ``ControllerCore``, which keeps the
cell's controller busy for as long as the cost model says its policy took. The cells planner that
``serve --cells`` runs (``cells/planner.py``) sends each request to one of its model's cells: it
decides which cells serve a model from the demand measured so far, and picks among them from each
cell's load signal, which is computed on the cell's core, so it is as stale as a busy controller
makes it, and reaches the router ``signal_delay_ns`` later. With one cell this is one controller
with its CPU on the clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from mainspring.cells.cost import LIVE_COST, ControllerCost, CostedScheduler
from mainspring.cells.placement import Placement, PlacementConfig
from mainspring.cells.planner import CellsPlanner, PlannerConfig, Replan, capacity_of_specs
from mainspring.cells.routing import Costs, routing_costs
from mainspring.cells.signal import cell_signal
from mainspring.controller import Controller
from mainspring.frontend.shedding import ArrivalGate
from mainspring.models.profile import ModelProfile
from mainspring.protocol import Action, ActionResult, DeviceSpec, Outcome, Request, Response
from mainspring.scheduler.base import Scheduler, Warms
from mainspring.scheduler.common import PolicyBookkeeping
from mainspring.scheduler.registry import make_scheduler
from mainspring.scheduler.timed import TimedScheduler
from mainspring.sim.core import ControllerCore
from mainspring.sim.engine import PRIORITY_WAKEUP, EventLoop
from mainspring.sim.frontend import TICK_NS, FrontendRow
from mainspring.sim.machine import Machine, MachineShare
from mainspring.telemetry.recorder import Recorder
from mainspring.time import NS_PER_MS, NS_PER_S
from mainspring.worker.runtimes.emulated import EmulatedDevice

CELL_ACTION_IDS = 1 << 40  # each cell numbers its actions from its index times this


@dataclass(frozen=True)
class CellsConfig:
    cells: int = 1
    # The policy's calls, the live process around them and the frontend (``cells/cost.py``);
    # ``CLOCKWORK_COST``: the policy alone, no frontend core (the figures before the process was modelled).
    cost: ControllerCost = LIVE_COST
    frontends: int = 1  # frontend processes, each a core of its own (none while the frontend costs nothing)
    signal_period_ns: int = 5 * NS_PER_MS
    signal_delay_ns: int = 1 * NS_PER_MS  # from a cell to the routers
    replan_ns: int = 2 * NS_PER_S
    handover_ns: int = NS_PER_S  # a moved model is served by its old and new cells for this long
    retry_rejected: bool = False  # a rejection is tried again on a cell whose signal says it can make it
    # A cell whose controller is this far behind refuses new requests at once, as ``serve`` does
    # (``max_loop_lag_ms``, half the SLO by default); None: the simulation's SLO halved.
    max_lag_ns: int | None = None
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    # The cores the frontends and the cells' controllers share (``sim/machine.py``); None: a core each.
    machine: MachineShare | None = None

    def __post_init__(self) -> None:
        if self.cells < 1:
            raise ValueError(f"cells must be at least 1, got {self.cells}")
        for name in ("signal_period_ns", "replan_ns"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("signal_delay_ns", "handover_ns", "max_lag_ns", "frontends"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")


def split_devices(specs: Sequence[DeviceSpec], cells: int) -> list[list[DeviceSpec]]:
    """``cells`` runs of consecutive devices, their sizes at most one apart."""
    if not 1 <= cells <= len(specs):
        raise ValueError(f"cannot split {len(specs)} device(s) into {cells} cell(s): each cell needs a device")
    size, extra = divmod(len(specs), cells)
    groups: list[list[DeviceSpec]] = []
    start = 0
    for index in range(cells):
        end = start + size + (1 if index < extra else 0)
        groups.append(list(specs[start:end]))
        start = end
    return groups


@dataclass(frozen=True)
class CellRow:
    cell: int
    devices: int
    requests: int  # routed to it (second tries included)
    refused: int  # of those, refused at once because its controller was too far behind
    busy: float  # share of the run its controller core was deciding
    cost_us_per_request: float  # modelled controller time per request routed to it
    most_waited_ms: float  # the longest an event waited for its core


@dataclass(frozen=True)
class CellsSummary:
    cells: list[CellRow]
    replans: int
    moves: int  # a model's cells changed at a re-plan
    replicated: int  # models served by more than one cell at the end
    routed_by_signal: int
    second_tries: int
    second_tries_served: int
    frontends: list[FrontendRow] = field(default_factory=list)  # none: the frontend cost nothing

    @property
    def cores(self) -> int:
        return len(self.cells)


def format_cells(summary: CellsSummary) -> str:
    """Each cell's controller core, and what the routing did."""
    lines = [
        f"{summary.cores} controller core(s); {summary.replans} re-plans moved {summary.moves} model(s); "
        f"{summary.replicated} model(s) in more than one cell; {summary.routed_by_signal:,} requests routed by "
        f"signal; {summary.second_tries:,} second tries ({summary.second_tries_served:,} served)",
        f"{'cell':>4} {'devices':>7} {'requests':>9} {'refused':>8} {'core busy':>9} {'us/request':>10}"
        f" {'longest wait ms':>15}",
    ]
    lines += [
        f"{c.cell:>4} {c.devices:>7} {c.requests:>9,} {c.refused:>8,} {c.busy:>9.1%} {c.cost_us_per_request:>10.1f}"
        f" {c.most_waited_ms:>15.2f}"
        for c in summary.cells
    ]
    if summary.frontends:
        lines.append(f"{'frontend':>8} {'calls':>9} {'shed':>8} {'core busy':>9} {'latest timer ms':>15}")
        lines += [f"{f.frontend:>8} {f.calls:>9,} {f.shed:>8,} {f.busy:>9.1%} {f.most_lag_ms:>15.2f}"
                  for f in summary.frontends]  # fmt: skip
    return "\n".join(lines)


class _Unanswered:
    """A cell's observer: its recorder, except answers, which the run records when they leave the core."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def on_request(self, request: Request, now_ns: int) -> None:
        self.recorder.on_request(request, now_ns)

    def on_action(self, action: Action, now_ns: int) -> None:
        self.recorder.on_action(action, now_ns)

    def on_result(self, result: ActionResult, action: Action, now_ns: int) -> None:
        self.recorder.on_result(result, action, now_ns)

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        pass


class _CoreLink:
    """An action leaves when the core's turn ends, then crosses the network."""

    def __init__(self, core: ControllerCore, submit: Callable[[Action], None]) -> None:
        self._core = core
        self._submit = submit

    def submit(self, action: Action) -> None:
        self._core.send(partial(self._submit, action))


AnswerHook = Callable[["Cell", Request, Response, object], None]


class Cell:
    """One controller core, its policy and its devices."""

    def __init__(
        self,
        index: int,
        specs: list[DeviceSpec],
        scheduler: Scheduler,
        devices: list[EmulatedDevice],
        links: Mapping[int, Callable[[Action], None]],
        run: CellWiring,
    ) -> None:
        self.index = index
        self.specs = specs
        self.policy = scheduler
        self.timed = TimedScheduler(scheduler)
        wrapped = self.timed if run.wrap is None else run.wrap(self.timed)
        self.costed = CostedScheduler(wrapped, run.cost, len(specs))
        self.core = ControllerCore(run.loop, self.costed, run.machine)
        self.devices = devices
        self.recorder = Recorder()
        self.requests = 0
        self.refused = 0  # by the server load limits (max_loop_lag_ms)
        self._waiting: dict[int, Request] = {}  # sent to the core, not yet taken in
        self._unreleased = 0
        core_links = {device: _CoreLink(self.core, submit) for device, submit in links.items()}
        self.controller = Controller(
            self.costed,
            run.loop.clock,
            core_links,
            partial(self._answered, run.answered),
            self._wakeup,
            _Unanswered(self.recorder),
            defer=self.core.defer,
        )
        self._loop = run.loop
        self._hook = run.answered
        self.gate: ArrivalGate | None = None  # sheds at arrival while its core runs late (``watch``)
        self._running: Callable[[], bool] = lambda: False

    def watch(self, target_ns: int, running: Callable[[], bool]) -> None:
        """Shed at arrival as a live cell's frontend channel does: a 5 ms timer on this core, and the arrival
        gate (``frontend/shedding.py``) it feeds, asked as the core takes each request in."""
        self.gate, self._running = ArrivalGate(target_ns), running
        self._loop.call_at(self._loop.now_ns() + TICK_NS, self._timer_due, PRIORITY_WAKEUP)

    def _timer_due(self) -> None:
        self.core.post(partial(self._timer_woke, self._loop.now_ns()))

    def _timer_woke(self, due_ns: int) -> None:
        now = self._loop.now_ns()
        assert self.gate is not None
        self.gate.woke(now - due_ns)
        if self._running():
            self._loop.call_at(now + TICK_NS, self._timer_due, PRIORITY_WAKEUP)

    @property
    def outstanding(self) -> int:
        """Requests not yet answered to the client: waiting for the core, in the policy, or decided on
        in a turn that has not ended."""
        return len(self._waiting) + self.controller.outstanding + self._unreleased

    def submit(self, request: Request) -> None:
        self.requests += 1
        self._waiting[request.id] = request
        self.core.post(partial(self._take, request))

    def _take(self, request: Request) -> None:
        if self._waiting.pop(request.id, None) is None:
            return  # answered at shutdown
        if self.gate is None or self.gate.admit():
            self.controller.submit(request)
            return
        self._refused(request, self.gate.reason(), self._loop.now_ns(), partial(self._answered, self._hook))

    def shutdown(self, reason: str, answer: AnswerHook) -> None:
        """The run is over: what the core still holds is answered (the requests it never took in too)."""
        now = self._loop.now_ns()
        for request in list(self._waiting.values()):
            del self._waiting[request.id]
            self.recorder.on_request(request, now)
            answer(self, request, Response(request.id, Outcome.SHUTTING_DOWN, reason), None)
        self.controller.shutdown(reason)
        self.core.flush()

    def refuse(self, request: Request, lag_ns: int, now_ns: int, answer: AnswerHook) -> None:
        """Its controller is too far behind to take ``request``: refused before it reaches the policy."""
        self.requests += 1
        reason = f"the controller is {lag_ns / NS_PER_MS:.0f} ms behind (max_loop_lag_ms)"
        self._refused(request, reason, now_ns, partial(answer, self))

    def _refused(self, request: Request, reason: str, now_ns: int, answer: Callable[..., None]) -> None:
        """Refused ``overloaded`` before the policy sees it (the controller's load limits or its gate)."""
        self.refused += 1
        self.costed.refuse()
        self.recorder.on_request(request, now_ns)
        answer(request, Response(request.id, Outcome.OVERLOADED, reason), None)

    def deliver(self, result: ActionResult) -> None:
        self.core.post(partial(self.controller.deliver, result))

    def _wakeup(self, time_ns: int) -> None:
        self._loop.call_at(time_ns, partial(self.core.post, self.controller.wake), PRIORITY_WAKEUP)

    def _answered(self, hook: AnswerHook, request: Request, response: Response, output: object) -> None:
        self._unreleased += 1
        self.core.send(partial(self._release, hook, request, response, output))

    def _release(self, hook: AnswerHook, request: Request, response: Response, output: object) -> None:
        self._unreleased -= 1
        hook(self, request, response, output)

    def row(self, span_ns: int) -> CellRow:
        return CellRow(
            self.index,
            len(self.specs),
            self.requests,
            self.refused,
            self.core.busy_ns / max(span_ns, 1),
            self.costed.total_ns / 1000 / max(self.requests, 1),
            self.core.most_waited_ns / NS_PER_MS,
        )


@dataclass
class CellWiring:
    """What every cell shares of the run."""

    loop: EventLoop
    cost: ControllerCost
    wrap: Callable[[Scheduler], Scheduler] | None
    answered: AnswerHook
    machine: Machine


def make_cells(
    policy: str,
    by_name: Mapping[str, ModelProfile],
    groups: list[list[DeviceSpec]],
    seed_of: Callable[[str], int],
    build_devices: Callable[[list[DeviceSpec], Callable[[ActionResult], None]], list[EmulatedDevice]],
    links_of: Callable[[list[EmulatedDevice]], Mapping[int, Callable[[Action], None]]],
    wiring: CellWiring,
    margin_ns: int,
    settings: Mapping[str, object] | None,
) -> list[Cell]:
    cells: list[Cell] = []
    for index, specs in enumerate(groups):
        rng = random.Random(seed_of(f"scheduler{index}"))
        scheduler = make_scheduler(policy, by_name, specs, rng, margin_ns, settings, "--clockwork")
        if isinstance(scheduler, PolicyBookkeeping):
            scheduler.number_actions_from(index * CELL_ACTION_IDS + 1)
        sink = _LateSink()
        devices = build_devices(specs, sink)
        cell = Cell(index, specs, scheduler, devices, links_of(devices), wiring)
        sink.cell = cell
        cells.append(cell)
    return cells


def _warm(cell: Cell, model: str) -> None:
    if isinstance(cell.policy, Warms) and cell.policy.warm(model):
        cell.controller.pump()


class _LateSink:
    """A device's result sink, bound to its cell once the cell exists."""

    cell: Cell | None = None

    def __call__(self, result: ActionResult) -> None:
        assert self.cell is not None
        self.cell.deliver(result)


class Routing:
    """The shared planner (``cells/planner.py``) over the simulated cells: every cell holds every model
    and is always up, so each is able to serve every request; this adds the counters and the signals."""

    def __init__(self, cells: list[Cell], by_name: Mapping[str, ModelProfile], config: CellsConfig) -> None:
        self.cells = cells
        self.config = config
        planner = PlannerConfig(replan_ns=config.replan_ns, handover_ns=config.handover_ns, placement=config.placement)
        self.planner = CellsPlanner(planner)
        self.router = self.planner.router
        self._profiles = by_name
        self._costs = {name: routing_costs(p) for name, p in by_name.items()}
        self._capacities = [capacity_of_specs(c.index, c.specs) for c in cells]
        self._all = range(len(cells))
        self.replans = 0
        self.moves = 0
        self.second_tries_served = 0
        self.first_plan = self.planner.replan(0, self._capacities, by_name)

    @property
    def placement(self) -> Placement:
        return self.planner.placement

    @property
    def shared(self) -> Mapping[int, Sequence[str]]:
        """Cell -> the models it serves with other cells (what its signal carries)."""
        return self.planner.shared

    def route(self, request: Request, now_ns: int) -> Cell:
        costs = self._costs.get(request.model) or Costs(0, 0, 0)
        chosen = self.planner.route(request.model, now_ns, self._all, self._all, costs)
        assert chosen is not None  # every cell is able
        return self.cells[chosen]

    def second_cell(self, cell: Cell, request: Request, response: Response, now_ns: int) -> Cell | None:
        if not self.config.retry_rejected or response.outcome is not Outcome.DEADLINE_AT_ARRIVAL:
            return None
        costs = self._costs.get(request.model)
        if costs is None:
            return None
        chosen = self.planner.retry(request.model, cell.index, now_ns, request.deadline_ns, self._all, self._all,
                                    costs, meet_deadline=True)  # fmt: skip
        return None if chosen is None else self.cells[chosen]

    def replan(self, now_ns: int) -> Replan:
        """The planner's re-plan; the models it warms are loaded on their new cells' cores."""
        replan = self.planner.replan(now_ns, self._capacities, self._profiles)
        assert replan is not None  # every profile, every cell
        self.moves += len(replan.changed)
        for index, model in replan.warms:  # loaded there before its requests come
            cell = self.cells[index]
            cell.core.post(partial(_warm, cell, model))
        self.replans += 1
        return replan

    def publish_from(
        self, cell: Cell, now_ns: Callable[[], int], deliver: Callable[[Callable[[], None]], None]
    ) -> None:
        """Computed on the cell's core when its turn comes (and charged to it), handed to the routers once
        the turn ends."""
        models = self.shared.get(cell.index, [])
        signal = cell_signal(cell.index, cell.policy, len(cell.specs), now_ns(), models)
        cell.costed.charge(self.config.cost.schedule(len(cell.specs), 0, 0))
        cell.core.send(partial(deliver, partial(self.router.publish, signal)))
