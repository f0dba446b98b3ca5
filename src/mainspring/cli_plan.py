"""``mainspring plan``: the devices and pool a workload needs at its SLO, found by simulating the policy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mainspring.cli_workload import CliError, add_workload_arguments, duration_s, prepare_outputs, workload_from
from mainspring.models.profile import model_copies
from mainspring.models.repository import profiles_from
from mainspring.protocol.pages import MIB
from mainspring.protocol.requests import slo_problem
from mainspring.scheduler.registry import parse_policies
from mainspring.sim.plan import Plan, PlanError, PlanPoint, plan
from mainspring.sim.run import SimulationConfig
from mainspring.time import ms_to_ns, s_to_ns

GIB = 1024 * MIB


def add_plan(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "plan", help="the fewest devices, then the smallest pool, that meet an attainment target (simulated)"
    )
    p.add_argument(
        "--profiles", type=Path, help="profile file or profiled model repository (default: Clockwork's V100 profiles)"
    )
    p.add_argument("--models", type=int, default=4026, help="model copies of the profiles (default 4026)")
    add_workload_arguments(p, default="azure", rate=1000.0, trace_scale=10.0, azure_duration_s=60.0)
    p.add_argument("--attainment", type=float, default=99.9, help="target: percent within SLO (default 99.9)")
    p.add_argument("--max-devices", type=int, default=64, help="the most devices tried (default 64)")
    p.add_argument("--device-memory-gib", type=float, default=32.0, help="the largest pool tried (default 32)")
    p.add_argument("--page-mib", type=int, default=16, help="page size (default 16 MiB)")
    p.add_argument("--policy", default="clockwork", help="the policy planned for (default clockwork)")
    p.add_argument("--json", type=Path, help="write the plan and every simulated point as JSON here")
    p.add_argument("--quiet", action="store_true", help="no line per simulated point")


def run_plan(args: argparse.Namespace) -> int:
    policies = parse_policies(args.policy)
    if len(policies) != 1:
        raise CliError(f"--policy takes one policy to plan for, got {args.policy}")
    (policy,) = policies
    seconds = duration_s(args)
    if seconds <= 0:
        raise CliError(f"--duration-s must be positive, got {seconds:g}")
    if (problem := slo_problem("--slo-ms", args.slo_ms)) is not None:
        raise CliError(problem)
    if args.device_memory_gib <= 0 or args.page_mib <= 0:
        raise CliError("--device-memory-gib and --page-mib must be positive")
    if args.models < 1:
        raise CliError(f"--models must be at least 1, got {args.models}")
    prepare_outputs({"--json": args.json}, {})
    config = SimulationConfig(
        duration_ns=s_to_ns(seconds),
        pool_bytes=int(args.device_memory_gib * GIB) // (args.page_mib * MIB) * (args.page_mib * MIB),
        page_bytes=args.page_mib * MIB,
        slo_ns=ms_to_ns(args.slo_ms),
        seed=args.seed,
    )
    profiles = model_copies(profiles_from(args.profiles), args.models)
    show = None if args.quiet else _print_point
    try:
        result = plan(profiles, workload_from(args), config, args.attainment / 100, args.max_devices, policy, show)
    except PlanError as error:
        raise CliError(str(error)) from None
    print(summary(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return 0 if result.devices is not None else 1


def _print_point(point: PlanPoint) -> None:
    print(
        f"  {point.devices:>3} devices, pool {point.pool_bytes / GIB:6.2f} GiB: {point.attainment:.4%} within SLO, "
        f"goodput {point.goodput_rps:.0f} r/s, p99 {point.p99_ms:.1f} ms, busy {point.busy:.0%}",
        flush=True,
    )


def summary(result: Plan) -> str:
    """The answer, with its margin: the attainment one device fewer and one more, and one page fewer."""
    target = f"{result.target:.4%}"
    if result.devices is None or result.pool_bytes is None:
        best = max(result.points, key=lambda p: p.attainment)
        return f"no plan: the most devices tried ({best.devices}) reach {best.attainment:.4%}, short of {target}"
    chosen = result.point(result.devices, result.pool_bytes)
    assert chosen is not None
    lines = [
        f"plan: {result.devices} devices with a {result.pool_bytes / GIB:.2f} GiB pool each reach "
        f"{chosen.attainment:.4%} within SLO (target {target}); goodput {chosen.goodput_rps:.0f} r/s, "
        f"p99 {chosen.p99_ms:.1f} ms, busy {chosen.busy:.0%}"
    ]
    full = max(p.pool_bytes for p in result.points)
    for devices in (result.devices - 1, result.devices + 1):
        point = result.point(devices, full)
        if point is not None:
            lines.append(f"  margin: {devices} devices reach {point.attainment:.4%}")
    return "\n".join(lines)
