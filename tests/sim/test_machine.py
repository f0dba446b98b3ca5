"""The machine the simulated frontends and controllers share: a core each by default; fewer cores than
processes wanting one (and a background of processes not simulated as cores) slow each in proportion."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mainspring.cells.cost import FREE, FrontendCost
from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.sim.cells import CellsConfig
from mainspring.sim.machine import Machine, MachineShare
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import NS_PER_MS, s_to_ns
from mainspring.workload import PoissonOpenLoop


def test_work_takes_longer_only_while_more_processes_want_a_core_than_there_are() -> None:
    machine = Machine(MachineShare(cores=2, background=0.5))
    assert machine.start(1000) == 1000  # 1.5 wanting, 2 cores
    assert machine.start(1000) == 1250  # 2.5 wanting 2 cores
    machine.end()
    machine.end()
    assert machine.start(1000) == 1000
    assert Machine().start(1000) == 1000  # no share: a core each
    with pytest.raises(ValueError, match="cores > 0"):
        MachineShare(cores=0)


def test_a_frontend_on_a_machine_half_busy_with_other_processes_takes_half_the_calls_on_time() -> None:
    """2 ms a call: a core of its own takes 500 calls a second; on one core half taken by the workers and
    the load generator, it takes about 333 (1 / (2 ms * 1.5)): at 300 its gate sheds and fewer are served on time."""
    cost = replace(FREE, frontend=FrontendCost(request_ns=2 * NS_PER_MS, refusal_ns=100_000))
    models = model_copies(builtin_profiles(), 24)
    config = SimulationConfig(duration_ns=s_to_ns(3), warmup_ns=s_to_ns(1), devices=4, seed=5)
    alone = simulate("clockwork", models, PoissonOpenLoop(300.0), config, cells=CellsConfig(1, cost))
    shared = CellsConfig(1, cost, machine=MachineShare(cores=1, background=0.5))
    crowded = simulate("clockwork", models, PoissonOpenLoop(300.0), config, cells=shared)
    assert alone.report.slo_attainment > 0.99  # below its core's capacity
    assert crowded.cells is not None and crowded.cells.frontends[0].shed > 0
    assert crowded.report.goodput_rps < 0.95 * alone.report.goodput_rps
