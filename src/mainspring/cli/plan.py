"""``mainspring plan``: the devices and pool a workload needs at its SLO, found by simulating the policy."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import NamedTuple

from mainspring.cells.placement import CELL_DEVICES, Placement
from mainspring.cli.values import (
    MAX_DEVICES,
    MAX_SCALE_FACTOR,
    MAX_SLO_MS,
    MIN_SLO_MS,
    PAGE_MIB,
    POOL_GIB,
    bounded_int,
    finite_float,
    number_list,
)
from mainspring.cli.workload import (
    CliError,
    add_noise_argument,
    add_profile_arguments,
    add_workload_arguments,
    duration_s,
    prepare_outputs,
    profiles_from_args,
    refuse_a_workload_past,
    refuse_pools_past,
    workload_from,
)
from mainspring.models.profile import ModelProfile
from mainspring.protocol.pages import MIB
from mainspring.protocol.requests import slo_problem
from mainspring.scheduler.registry import parse_policies
from mainspring.sim.plan import Plan, PlanError, PlanInputs, PlanPoint, cells_of_plan, check, plan
from mainspring.sim.run import SimulationConfig, generate_arrivals
from mainspring.telemetry.plots import plot_plan
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.worker.runtimes.emulated import NoiseModel
from mainspring.workload import Workload
from mainspring.workload.base import MAX_ARRIVALS

GIB = 1024 * MIB


def add_plan(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "plan", help="the fewest devices, then the smallest pool, that meet an attainment target (simulated)"
    )
    add_profile_arguments(p)
    add_noise_argument(p, "the devices'")
    add_workload_arguments(p, default="azure", rate=1000.0, trace_scale=10.0, azure_duration_s=60.0)
    p.add_argument("--attainment", type=finite_float(0, 100, low_open=True), default=99.9,
                   help="target: percent within SLO (default 99.9)")  # fmt: skip
    p.add_argument("--max-devices", type=bounded_int(1, MAX_DEVICES), default=64,
                   help="the most devices tried (default 64)")  # fmt: skip
    p.add_argument("--device-memory-gib", type=POOL_GIB, default=32.0, help="the largest pool tried (default 32)")
    p.add_argument("--page-mib", type=PAGE_MIB, default=16, help="page size (default 16 MiB)")
    p.add_argument("--cell-devices", type=bounded_int(1, MAX_DEVICES), default=CELL_DEVICES,
                   help=f"devices per cell at most (default {CELL_DEVICES})")  # fmt: skip
    p.add_argument("--policy", default="clockwork", help="the policy planned for (default clockwork)")
    p.add_argument("--what-if-slo", type=number_list(MIN_SLO_MS, MAX_SLO_MS), default=[],
                   help="comma-separated SLOs (ms) to plan for as well")  # fmt: skip
    p.add_argument("--what-if-scale", type=number_list(0, MAX_SCALE_FACTOR, low_open=True), default=[],
                   help="comma-separated load multipliers to plan for as well (2,5)")  # fmt: skip
    p.add_argument("--json", type=Path, help="write the plan and every simulated point as JSON here")
    p.add_argument("--plot", type=Path, help="write attainment against devices and against pool size (PNG) here")
    p.add_argument("--quiet", action="store_true", help="no line per simulated point")


class PlanSetup(NamedTuple):
    """``plan``'s work, checked: the policy, the profiles, the plan's inputs, and each case's label ("" for
    the plan, then the what-ifs), simulation settings and workload."""

    policy: str
    profiles: list[ModelProfile]
    inputs: PlanInputs
    cases: list[tuple[str, SimulationConfig, Workload]]


def plan_setup(args: argparse.Namespace) -> PlanSetup:
    """Every check ``plan`` makes before its first simulation, for the plan and each what-if (a what-if
    refused after the plan's minutes of work lost them)."""
    policies = parse_policies(args.policy)
    if len(policies) != 1:
        raise CliError(f"--policy takes one policy to plan for, got {args.policy}")
    prepare_outputs({"--json": args.json, "--plot": args.plot}, {})
    profiles = profiles_from_args(args)
    inputs = plan_inputs(args)
    cases = [("", "", inputs)]
    cases += [(f"SLO {v:g} ms", f"--what-if-slo {v:g}: ", inputs.with_slo(v)) for v in args.what_if_slo]
    cases += [(f"load x{v:g}", f"--what-if-scale {v:g}: ", inputs.scaled(v)) for v in args.what_if_scale]
    prepared = [(label, *_prepared(case, profiles, flag)) for label, flag, case in cases]
    return PlanSetup(policies[0], profiles, inputs, prepared)


def plan_inputs(args: argparse.Namespace) -> PlanInputs:
    """The plan's options as plain data, read once (the duration: the workload's default where not given)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(PlanInputs) if f.name != "duration_s"}
    return PlanInputs(**given, duration_s=duration_s(args))


def run_plan(args: argparse.Namespace) -> int:
    policy, profiles, inputs, prepared = plan_setup(args)
    (_, config, workload), what_ifs = prepared[0], prepared[1:]
    result, cells = _plan_once(inputs, profiles, policy, config, workload, verbose=not args.quiet)
    print(summary(result))
    if cells:
        assert result.devices is not None
        count = math.ceil(result.devices / inputs.cell_devices)
        print(f"  cells: {count} of at most {inputs.cell_devices} devices each (--json: which serve each model)")
    what_if = []
    for label, other_config, other_workload in what_ifs:
        other, _ = _plan_once(inputs, profiles, policy, other_config, other_workload, verbose=False)
        what_if.append((label, other))
        print(f"what if {label}: " + summary(other).splitlines()[0])
    if args.json is not None:
        document = result.to_json() | {"placement": cells, "what_if": {k: v.to_json() for k, v in what_if}}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.plot is not None:
        plot_plan(result, args.plot)
    return 0 if result.devices is not None else 1


def _prepared(inputs: PlanInputs, profiles: list[ModelProfile], flag: str) -> tuple[SimulationConfig, Workload]:
    """One case's simulation settings and workload, after every check ``simulate`` makes up front
    (``flag`` names the what-if option in front of the message)."""
    try:
        if (problem := slo_problem("--slo-ms", inputs.slo_ms)) is not None:
            raise CliError(problem)
        page = inputs.page_mib * MIB
        if inputs.device_memory_gib * GIB < page:
            raise CliError(
                f"--device-memory-gib {inputs.device_memory_gib:g} holds no page of --page-mib {inputs.page_mib}"
            )
        config = SimulationConfig(
            duration_ns=s_to_ns(inputs.duration_s),
            device_kind=profiles[0].device_kind,
            noise=NoiseModel.named(inputs.noise),
            pool_bytes=int(inputs.device_memory_gib * GIB) // page * page,
            page_bytes=page,
            slo_ns=ms_to_ns(inputs.slo_ms),
            seed=inputs.seed,
        )
        refuse_pools_past(inputs.max_devices, config.pool_bytes, page)
        workload = workload_from(inputs)
        refuse_a_workload_past(MAX_ARRIVALS, inputs, workload, len(profiles), inputs.duration_s)
        check(profiles, config, inputs.attainment / 100, inputs.max_devices)
    except (CliError, ValueError) as error:  # PlanError too
        raise CliError(f"{flag}{error}") from None
    return config, workload


def _plan_once(
    inputs: PlanInputs,
    profiles: list[ModelProfile],
    policy: str,
    config: SimulationConfig,
    workload: Workload,
    verbose: bool,
) -> tuple[Plan, Placement]:
    arrivals = generate_arrivals(workload, profiles, config)
    try:
        result = plan(profiles, workload, config, inputs.attainment / 100, inputs.max_devices, policy,
                      _print_point if verbose else None, arrivals)  # fmt: skip
    except PlanError as error:
        raise CliError(str(error)) from None
    return result, cells_of_plan(result, profiles, config, arrivals, inputs.cell_devices)


def _print_point(point: PlanPoint) -> None:
    print(f"  {_devices(point.devices):>11}, pool {_size(point.pool_bytes):>9}: {describe(point)}", flush=True)


def _devices(count: int) -> str:
    return f"{count} device" + ("" if count == 1 else "s")


def _size(pool_bytes: int) -> str:
    """A pool in MiB below a GiB (a page is 16 MiB by default), else in GiB."""
    return f"{pool_bytes / MIB:.0f} MiB" if pool_bytes < GIB else f"{pool_bytes / GIB:.2f} GiB"


def describe(point: PlanPoint) -> str:
    """What one simulated point measured: in full, or the bound a stopped one reached."""
    if point.goodput_rps is None or point.p99_ms is None or point.busy is None:
        return f"at most {point.attainment:.4%} within SLO (stopped once it could no longer meet the target)"
    return (
        f"{point.attainment:.4%} within SLO, goodput {point.goodput_rps:.0f} r/s, p99 {point.p99_ms:.1f} ms, "
        f"busy {point.busy:.0%}"
    )


def summary(result: Plan) -> str:
    """The answer, with its margin: the attainment one device fewer and one more, and with the largest
    pool that missed."""
    target = f"{result.target:.4%}"
    if result.reason:
        return f"no plan: {result.reason}"
    if result.devices is None or result.pool_bytes is None:
        best = max(result.points, key=lambda p: (p.complete, p.attainment))
        return f"no plan: the best tried ({best.devices} devices) reaches {best.attainment:.4%}, short of {target}"
    chosen = result.point(result.devices, result.pool_bytes)
    assert chosen is not None
    lines = [
        f"plan: {_devices(result.devices)} with a {_size(result.pool_bytes)} pool each (target {target}): "
        + describe(chosen)
    ]
    full = max(p.pool_bytes for p in result.points)
    for devices in (result.devices - 1, result.devices + 1):
        point = result.point(devices, full)
        if point is not None:
            lines.append(f"  margin: {_devices(devices)} reach {point.attainment:.4%}")
    smaller = [p for p in result.points if p.devices == result.devices and p.pool_bytes < result.pool_bytes]
    if smaller:
        point = max(smaller, key=lambda p: p.pool_bytes)
        lines.append(f"  margin: a {_size(point.pool_bytes)} pool reaches {point.attainment:.4%}")
    return "\n".join(lines)
