"""One arrival sequence through the live cells port and through the simulator's cells: the same re-plans,
the same cell for every request, the same handovers (the simulator runs what serves)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path

from mainspring.cells.planner import CellsPlanner, Replan
from mainspring.cells.routing import CellSignal, routing_costs
from mainspring.controller.frontends import FrontendHub
from mainspring.controller.service import ControllerService
from mainspring.frontend.cells_port import CellsPort
from mainspring.frontend.dataplane import DataPlane
from mainspring.sim.cells import CellsConfig, Routing
from mainspring.sim.run import SimulationConfig, _CellsRun
from mainspring.time import NS_PER_MS, NS_PER_S, ManualClock
from mainspring.workload import PoissonOpenLoop
from tests.controller.test_service import with_service
from tests.fakes import request

MODELS = [f"m{i:02d}" for i in range(12)]
STEP_NS = 50 * NS_PER_MS
END_NS = 10 * NS_PER_S  # the hot model cools by the re-plan at 9.75 s
HOT = "m00"  # from 1 s to 6 s: busy enough for a second cell, then cool again
HOT_FROM, HOT_UNTIL = NS_PER_S, 6 * NS_PER_S
SKEW_FROM, SKEW_UNTIL = 2 * NS_PER_S, 4 * NS_PER_S
ALL = (0, 1, 2)


def signals(now_ns: int) -> list[CellSignal]:
    """Every cell's signal: each model ending 1 to 3 ms on, varied by cell and model."""
    return [
        CellSignal(
            cell, now_ns, 2, {m: now_ns + (1 + (cell + i) % 3) * NS_PER_MS for i, m in enumerate(MODELS)}, now_ns
        )
        for cell in ALL
    ]


class Trace:
    """What one side decided."""

    def __init__(self) -> None:
        self.replans: list[Replan] = []
        self.chosen: list[int] = []
        self.ends: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []  # a handover's cells at until-1, until


def crowded(placement: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Two cool models the first plan put on one cell: busy together from 2 s to 4 s, one must move."""
    by_cell: dict[tuple[int, ...], list[str]] = {}
    for model, cells in sorted(placement.items()):
        if model != HOT:
            by_cell.setdefault(cells, []).append(model)
    return next(models[:2] for models in by_cell.values() if len(models) >= 2)


def drive(
    planner: CellsPlanner,
    replan: Callable[[int], Replan | None],
    route: Callable[[str, int], int],
    publish: Callable[[CellSignal], None],
    busy_per_step: int,
) -> Trace:
    """The arrival script: every model once a step, the hot one ``busy_per_step`` more while hot, two
    crowded ones 40% of that each while skewed; signals every 200 ms; each re-plan when it is due."""
    trace = Trace()
    skewed = crowded(planner.placement)
    for now in range(0, END_NS, STEP_NS):
        if now % (4 * STEP_NS) == 0:
            for signal in signals(now):
                publish(signal)
        if now == planner.next_replan_ns and now > 0:
            done = replan(now)
            assert done is not None
            trace.replans.append(done)
        for begun in trace.replans:
            for model, handover in begun.handovers.items():
                if handover.until_ns == now:
                    before, at = (planner.candidates(model, t, ALL, ALL) for t in (now - 1, now))
                    trace.ends.append((model, before, at))
        hot = busy_per_step if HOT_FROM <= now < HOT_UNTIL else 0
        skew = busy_per_step * 2 // 5 if SKEW_FROM <= now < SKEW_UNTIL else 0
        for model in MODELS + [HOT] * hot + skewed * skew:
            trace.chosen.append(route(model, now))
    return trace


def live_trace(port: CellsPort, clock: ManualClock, hot_per_step: int) -> Trace:
    """CellsPort's own path: ``_route`` (``infer``'s choice) and ``_plan_tick`` (its re-plan timer's)."""
    first = port._plan_tick()
    assert first is not None

    def route(model: str, now_ns: int) -> int:
        clock.set(now_ns)
        return port._route(model, 1, now_ns)

    def replan(now_ns: int) -> Replan | None:
        clock.set(now_ns)
        return port._plan_tick()

    def publish(signal: CellSignal) -> None:
        clock.set(signal.at_ns)
        port.roster.on_signal(signal)

    trace = drive(port.planner, replan, route, publish, hot_per_step)
    trace.replans.insert(0, first)
    return trace


def sim_trace(routing: Routing, hot_per_step: int) -> Trace:
    ids = iter(range(10**9))
    first = routing.first_plan
    assert first is not None

    def route(model: str, now_ns: int) -> int:
        return routing.route(request(next(ids), model, now_ns), now_ns).index

    trace = drive(routing.planner, routing.replan, route, routing.router.publish, hot_per_step)
    trace.replans.insert(0, first)
    return trace


def test_the_live_port_and_the_simulator_decide_the_same(tmp_path: Path) -> None:
    async def test(service: ControllerService, _: DataPlane, __: object) -> None:
        hubs = [FrontendHub(service, f"ipc://{tmp_path}/cell-{i}") for i in ALL]
        for hub in hubs:
            await hub.start()
        clock = ManualClock()
        port = CellsPort("frontend", [h.endpoint for h in hubs], [f"ipc://{tmp_path}/signal-{i}" for i in ALL],
                         clock=clock)  # fmt: skip
        try:  # start's joins, without its timers: the test moves the clock
            await asyncio.gather(*(cell.start(10) for cell in port.cells))
            for index in ALL:
                port.roster.carry(port.membership.joined(index))
            profiles = [served.profile for served in port.models.values()]
            assert sorted(port.models) == MODELS and all(cell.pool_bytes > 0 for cell in port.cells)
            # 1.7 devices busy: past half a cell's two devices (with the band), short of three cells
            hot_per_step = round(1.7 * NS_PER_S / routing_costs(profiles[0]).work_ns * STEP_NS / NS_PER_S)
            run = _CellsRun("clockwork", profiles, PoissonOpenLoop(1.0), SimulationConfig(NS_PER_S, devices=6),
                            CellsConfig(3))  # fmt: skip
            live, simulated = live_trace(port, clock, hot_per_step), sim_trace(run.routing, hot_per_step)
        finally:
            await port.close()
            for hub in hubs:
                await hub.close()
        assert live.replans == simulated.replans
        assert live.chosen == simulated.chosen
        gained = [r for r in live.replans if HOT in r.handovers]
        dropped = [r for r in live.replans if HOT in r.changed and HOT not in r.handovers]
        assert len(gained) == 1 and len(gained[0].placement[HOT]) == 2 and gained[0].warms
        assert len(dropped) == 1 and len(dropped[0].placement[HOT]) == 1  # cooled: no handover, nothing warmed
        assert live.ends == simulated.ends
        (hot_end,) = [(before, at) for model, before, at in live.ends if model == HOT]
        assert hot_end == (gained[0].placement[HOT],) * 2  # a gained replica: its old cell stays
        moves = [(before, at) for model, before, at in live.ends if model != HOT]
        assert moves and all(set(at) < set(before) for before, at in moves)  # a move: the old cell stops at until

    with_service(test, models=MODELS)
