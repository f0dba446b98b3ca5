"""Command line: ``mainspring simulate`` (and, later, serve, worker, profile, zoo)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple, cast

from mainspring.cells.cost import CLOCKWORK_COST, LIVE_COST
from mainspring.cli.bench import add_bench, run_bench
from mainspring.cli.models import add_profile, add_zoo, run_profile, run_zoo
from mainspring.cli.plan import add_plan, run_plan
from mainspring.cli.serve import add_serve, add_worker, run_serve, run_worker
from mainspring.cli.values import (
    MAX_DEVICES,
    NETWORK_LATENCY_US,
    PAGE_MIB,
    POOL_GIB,
    SECONDS,
    OneLineParser,
    bounded_int,
    one_line,
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
from mainspring.scheduler.registry import SETTABLE, clockwork_config, parse_policies, policy_names
from mainspring.settings import key_values
from mainspring.sim.cells import CellsConfig, format_cells
from mainspring.sim.run import SimulationConfig, SimulationResult, generate_arrivals, simulate
from mainspring.telemetry.report import format_table
from mainspring.time import NS_PER_S, ms_to_ns, s_to_ns
from mainspring.worker.runtimes.emulated import NoiseModel
from mainspring.workload import Arrival, Workload
from mainspring.workload.base import MAX_ARRIVALS

# What a bare ``mainspring simulate`` shows: the predictive policy beside the reactive baselines, on
# the bundled trace at x10 for five minutes (its bursts come after minute 3); 30 s here.
SIMULATE_POLICIES = "clockwork,triton,clipper"


def _add_simulate(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("simulate", help="replay a workload on emulated devices, policies side by side")
    p.add_argument(
        "--policy",
        default=SIMULATE_POLICIES,
        help=f"comma-separated policies ({', '.join(policy_names())}; default {SIMULATE_POLICIES})",
    )
    p.add_argument(
        "--clockwork",
        action="append",
        metavar="KEY=VALUE",
        help="a clockwork policy setting, e.g. estimate_percentile=90 (repeatable; docs/scheduler/settings.md)",
    )
    p.add_argument("--devices", type=bounded_int(1, MAX_DEVICES), default=6, help="emulated devices (default 6)")
    add_profile_arguments(p)
    add_workload_arguments(p, default="azure", rate=1000.0, trace_scale=10.0, azure_duration_s=300.0)
    p.add_argument(
        "--warmup-s",
        type=SECONDS,
        default=0.0,
        help="serve this long before counting (every model starts cold); azure: whole minutes, the replay starts "
        "that much before --trace-start-minute (default 0)",
    )
    add_noise_argument(p)
    p.add_argument("--device-memory-gib", type=POOL_GIB, default=32.0, help="weight pool per device (default 32)")
    p.add_argument("--page-mib", type=PAGE_MIB, default=16, help="page size (default 16 MiB)")
    p.add_argument(
        "--network-latency-us",
        type=NETWORK_LATENCY_US,
        default=0.0,
        help="one way between the controller and each emulated worker, for actions and results alike; deadlines "
        "keep it for the answer's trip back, and infer5's send gate holds an action that long (default 0)",
    )
    p.add_argument(
        "--cells",
        type=bounded_int(0, MAX_DEVICES),
        default=0,
        help="split the devices into this many cells, each planned by a controller core whose CPU time is on "
        "the simulated clock (docs/simulator.md); 0 (default): one controller that costs no time",
    )
    p.add_argument(
        "--retry-rejected",
        action="store_true",
        help="with --cells: try a rejected request once more on another cell whose signal says it can make it",
    )
    p.add_argument(
        "--controller-cost",
        choices=("live", "policy"),
        default="live",
        help="with --cells: what the controller's and the frontends' cores are charged (docs/simulator.md): live "
        "(default), the whole live processes as fitted; policy, the policy's calls alone and no frontend core",
    )
    p.add_argument(
        "--frontends",
        type=bounded_int(1, MAX_DEVICES),
        default=1,
        help="with --cells: frontend processes in front of the cells, each a core of its own (default 1)",
    )
    p.add_argument("--json", type=Path, help="write the results as JSON here")
    p.add_argument("--plot", type=Path, help="write PNG plots into this folder")
    p.add_argument("--log-dir", type=Path, help="write request and action logs (TSV) into this folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="mainspring", description="Predictable DNN model serving.")
    # OneLineParser's subparsers are OneLineParsers; the add_* helpers take any ArgumentParser's.
    commands = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]", parser.add_subparsers(dest="command", required=True)
    )
    _add_simulate(commands)
    add_zoo(commands)
    add_profile(commands)
    add_serve(commands)
    add_worker(commands)
    add_bench(commands)
    add_plan(commands)
    p = commands.add_parser("analyze", help="why requests missed their SLO, from simulate or serve --log-dir logs")
    p.add_argument("log_dir", type=Path)
    p.add_argument("--top", type=bounded_int(1, 1000), default=3, help="models named per cause (default 3)")
    return parser


def _config(args: argparse.Namespace, device_kind: str) -> SimulationConfig:
    """The run's settings; each flag's range was checked as it was parsed (``cli/values.py``)."""
    seconds = duration_s(args)
    if (problem := slo_problem("--slo-ms", args.slo_ms)) is not None:
        raise CliError(problem)
    if args.device_memory_gib * 1024 < args.page_mib:
        raise CliError(f"--device-memory-gib {args.device_memory_gib:g} holds no page of --page-mib {args.page_mib}")
    refuse_pools_past(args.devices, int(args.device_memory_gib * 1024 * MIB), args.page_mib * MIB)
    return SimulationConfig(
        duration_ns=s_to_ns(seconds),
        warmup_ns=s_to_ns(args.warmup_s),
        devices=args.devices,
        device_kind=device_kind,
        pool_bytes=int(args.device_memory_gib * 1024 * MIB),
        page_bytes=args.page_mib * MIB,
        slo_ns=ms_to_ns(args.slo_ms),
        seed=args.seed,
        noise=NoiseModel.named(args.noise),
        network_latency_ns=round(args.network_latency_us * 1_000),
    )


def _cells(args: argparse.Namespace) -> CellsConfig | None:
    if args.cells < 0 or args.cells > args.devices:
        raise CliError(f"--cells must be between 0 and --devices ({args.devices}), got {args.cells}")
    if args.retry_rejected and not args.cells:
        raise CliError("--retry-rejected needs --cells")
    if not args.cells:
        return None
    cost = LIVE_COST if args.controller_cost == "live" else CLOCKWORK_COST
    return CellsConfig(args.cells, cost, frontends=args.frontends, retry_rejected=args.retry_rejected)


class SimulateSetup(NamedTuple):
    policies: list[str]
    clockwork: dict[str, str]
    profiles: list[ModelProfile]
    config: SimulationConfig
    cells: CellsConfig | None
    workload: Workload


def simulate_setup(args: argparse.Namespace) -> SimulateSetup:
    """Every check ``simulate`` makes before it generates an arrival: a bad value is told at once."""
    policies = parse_policies(args.policy)
    clockwork = key_values(args.clockwork, "--clockwork")
    if clockwork and not set(policies) & set(SETTABLE):
        raise CliError(f"--clockwork settings apply to policy clockwork, which --policy {args.policy} leaves out")
    clockwork_config(clockwork, "--clockwork")  # every setting checked before the first run
    profiles = profiles_from_args(args)
    config = _config(args, profiles[0].device_kind)
    cells = _cells(args)
    workload = workload_from(args)
    prepare_outputs({"--json": args.json}, {"--log-dir": args.log_dir, "--plot": args.plot})
    refuse_a_workload_past(MAX_ARRIVALS, args, workload, len(profiles), config.arrival_window_ns / NS_PER_S)
    return SimulateSetup(policies, clockwork, profiles, config, cells, workload)


def _run_simulate(args: argparse.Namespace) -> int:
    policies, clockwork, profiles, config, cells, workload = simulate_setup(args)
    arrivals = generate_arrivals(workload, profiles, config)
    results: dict[str, SimulationResult] = {}
    for policy in policies:
        settings = clockwork if policy in SETTABLE else None
        results[policy] = _simulate_with_progress(
            policy, profiles, workload, config, arrivals, args.quiet, settings, cells
        )
    reports = [r.report for r in results.values()]
    print(format_table(reports))
    for policy, result in results.items():
        if result.cells is not None:
            print(f"\n{policy}: " + format_cells(result.cells))
    if args.json is not None:
        rows = [r.report.to_json() | ({} if r.cells is None else {"cells": asdict(r.cells)}) for r in results.values()]
        args.json.write_text(json.dumps({"results": rows}, indent=2) + "\n")
    if args.log_dir is not None:
        for policy, result in results.items():
            result.recorder.write_logs(args.log_dir, policy)
    if args.plot is not None:
        from mainspring.telemetry.plots import write_plots

        write_plots({p: r.recorder for p, r in results.items()}, args.plot, args.slo_ms)
    return 0


def _simulate_with_progress(
    policy: str,
    profiles: list[ModelProfile],
    workload: Workload,
    config: SimulationConfig,
    arrivals: list[Arrival],
    quiet: bool,
    settings: Mapping[str, object] | None,
    cells: CellsConfig | None,
) -> SimulationResult:
    from tqdm import tqdm

    total_s = config.arrival_window_ns / NS_PER_S
    with tqdm(total=round(total_s, 1), desc=policy, unit="sim s", delay=2.0, disable=quiet, file=sys.stderr) as bar:

        def advance(now_ns: int) -> None:
            bar.update(round(now_ns / NS_PER_S - bar.n, 1))

        return simulate(policy, profiles, workload, config, arrivals, advance, settings=settings, cells=cells)


def _run_analyze(args: argparse.Namespace) -> int:
    from mainspring.telemetry.analyze import analyze, format_analysis, runs

    if not args.log_dir.is_dir():
        raise CliError(f"{args.log_dir} is not a folder")
    found = runs(args.log_dir)
    if not found:
        raise CliError(f"{args.log_dir} holds no <run>-requests.tsv with its <run>-actions.tsv")
    for run in found:
        try:
            analysis = analyze(args.log_dir, run)
        except ValueError as error:  # LogError names the line; a value that is no number, the run
            raise CliError(f"run {run!r} in {args.log_dir}: {error}") from None
        print(format_analysis(analysis, args.top))
    return 0


_COMMANDS = {
    "simulate": _run_simulate,
    "zoo": run_zoo,
    "profile": run_profile,
    "serve": run_serve,
    "worker": run_worker,
    "bench": run_bench,
    "plan": run_plan,
    "analyze": _run_analyze,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(_COMMANDS[args.command](args))
    except (CliError, ValueError) as error:
        parser.exit(2, one_line(f"mainspring {args.command}: error: {str(error)[:1000]}"))
    except OSError as error:  # a path the user gave that cannot be used (too long a name, no permission)
        where = f"{str(error.filename)[:200]}: " if error.filename else ""
        parser.exit(2, one_line(f"mainspring {args.command}: error: {where}{error.strerror or error}"))
