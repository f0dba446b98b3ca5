"""The workload options that ``simulate`` and ``bench`` share, and the workload they describe."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Protocol

from mainspring.cli.values import (
    MAX_CLIENTS,
    MAX_MODELS,
    MAX_OUTSTANDING,
    MAX_PROFILES_BYTES,
    MAX_RATE_RPS,
    MAX_TRACE_SCALE,
    POSITIVE_SECONDS,
    SEED,
    SLO_MS,
    bounded_int,
    finite_float,
    input_path,
)
from mainspring.models.profile import ModelProfile, model_copies
from mainspring.models.repository import profiles_from
from mainspring.protocol.pages import MIB
from mainspring.time import s_to_ns
from mainspring.worker.runtimes.emulated import NOISE_MODELS
from mainspring.workload import AzureTrace, BurstyOnOff, ClosedLoop, PoissonOpenLoop, SloSweep, Workload
from mainspring.workload.azure import MAX_TRACE_BYTES, MINUTES_PER_DAY

WORKLOADS = ("azure", "poisson", "bursty", "closed", "slo-sweep")
DEFAULT_DURATION_S = 60.0
# Every device's free-page list is held, about 40 bytes a page: 10 million pages is some 400 MB
# (a pool of 1e9 GiB was a MemoryError).
MAX_POOL_PAGES = 10_000_000


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class WorkloadOptions(Protocol):
    """The workload options, as argparse gives them or as plain data (``sim.plan.PlanInputs``)."""

    @property
    def workload(self) -> str: ...
    @property
    def trace(self) -> Path | None: ...
    @property
    def trace_scale(self) -> float: ...
    @property
    def trace_start_minute(self) -> int: ...
    @property
    def rate(self) -> float: ...
    @property
    def popularity(self) -> str: ...
    @property
    def clients(self) -> int: ...
    @property
    def outstanding(self) -> int: ...
    @property
    def sweep_growth(self) -> float: ...
    @property
    def sweep_interval_s(self) -> float: ...


def prepare_outputs(files: dict[str, Path | None], folders: dict[str, Path | None]) -> None:
    """Make the folders the results go to, before a run that may take long: a path that cannot be
    written is told now, not after the run (whose results would be lost). Keys are the flags."""
    wanted: list[tuple[str, Path, Path | None]] = [(f, p.parent, p) for f, p in files.items() if p is not None]
    wanted += [(flag, path, None) for flag, path in folders.items() if path is not None]
    for flag, folder, file in wanted:
        try:
            if folder.exists() and not folder.is_dir():
                raise NotADirectoryError(20, "is a file, not a folder")
            folder.mkdir(parents=True, exist_ok=True)
            if file is not None and file.is_dir():
                raise IsADirectoryError(21, "is a folder, not a file")
            if not os.access(folder, os.W_OK):
                raise PermissionError(13, "not writable")
        except OSError as error:
            raise CliError(f"{flag} {file or folder}: cannot write there: {error.strerror or error}") from None


def add_workload_arguments(
    p: argparse.ArgumentParser,
    default: str,
    rate: float,
    trace_scale: float = 1.0,
    azure_duration_s: float = DEFAULT_DURATION_S,
) -> None:
    """The shared options; ``azure_duration_s`` is the replay's default length (other workloads: 60 s)."""
    p.add_argument("--workload", default=default, help=f"one of {', '.join(WORKLOADS)} (default {default})")
    p.add_argument(
        "--trace", type=input_path(MAX_TRACE_BYTES), help="Azure Functions trace CSV (default: the bundled sample)"
    )
    p.add_argument(
        "--trace-scale",
        type=finite_float(0, MAX_TRACE_SCALE, low_open=True),
        default=trace_scale,
        help=f"multiply trace invocations (default {trace_scale:g})",
    )
    p.add_argument(
        "--trace-start-minute",
        type=bounded_int(0, MINUTES_PER_DAY - 1),
        default=0,
        help="first minute of the trace to replay",
    )
    p.add_argument(
        "--rate",
        type=finite_float(0, MAX_RATE_RPS, low_open=True),
        default=rate,
        help=f"requests/s (poisson, slo-sweep; per model for bursty) (default {rate:g})",
    )
    p.add_argument("--popularity", default="uniform", help="uniform or zipf (poisson, slo-sweep)")
    p.add_argument("--clients", type=bounded_int(1, MAX_CLIENTS), default=16, help="closed loop: clients")
    p.add_argument(
        "--outstanding",
        type=bounded_int(1, MAX_OUTSTANDING),
        default=1,
        help="closed loop: requests in flight per client",
    )
    p.add_argument(
        "--sweep-growth", type=finite_float(1, 100), default=1.5, help="slo-sweep: SLO factor growth per step"
    )
    p.add_argument("--sweep-interval-s", type=POSITIVE_SECONDS, default=10.0, help="slo-sweep: seconds per step")
    duration_help = f"seconds of arrivals (default {DEFAULT_DURATION_S:g})"
    if azure_duration_s != DEFAULT_DURATION_S:
        duration_help = f"seconds of arrivals (default {azure_duration_s:g} for azure, else {DEFAULT_DURATION_S:g})"
    p.add_argument("--duration-s", type=POSITIVE_SECONDS, help=duration_help)
    p.set_defaults(azure_duration_s=azure_duration_s)
    p.add_argument("--slo-ms", type=SLO_MS, default=100.0, help="default SLO (default 100 ms)")
    p.add_argument("--seed", type=SEED, default=1)


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profiles",
        type=input_path(MAX_PROFILES_BYTES, folder_too=True),
        help="profile file or profiled model repository (default: Clockwork's V100 profiles)",
    )
    p.add_argument(
        "--models", type=bounded_int(1, MAX_MODELS), default=4026, help="model copies of the profiles (default 4026)"
    )
    p.add_argument(
        "--device-kind", help="the device kind emulated, of those the profiles were measured on (default: theirs)"
    )


def profiles_from_args(args: argparse.Namespace) -> list[ModelProfile]:
    """``--models`` copies of the ``--profiles`` of one device kind: ``--device-kind``, or the only one they have."""
    if args.models < 1:
        raise CliError(f"--models must be at least 1, got {args.models}")
    try:
        profiles = profiles_from(args.profiles)
    except ValueError as error:
        raise CliError(f"--profiles: {error}") from None
    kinds = sorted({p.device_kind for p in profiles})
    if args.device_kind is None and len(kinds) > 1:
        raise CliError(f"the profiles are of {len(kinds)} device kinds ({', '.join(kinds)}): choose with --device-kind")
    chosen = [p for p in profiles if args.device_kind is None or p.device_kind == args.device_kind]
    if not chosen:
        raise CliError(
            f"--device-kind {args.device_kind}: no profile of that kind (the profiles are of {', '.join(kinds)})"
        )
    return model_copies(chosen, args.models)


def add_noise_argument(p: argparse.ArgumentParser, what: str = "emulated devices'") -> None:
    p.add_argument(
        "--noise",
        choices=NOISE_MODELS,
        default="default",
        help=f"{what} duration noise: the simulator's default (2%% jitter, rare spikes), exact, or a CPU shared "
        "with other processes' (shared-cpu: 15%% jitter, 5%% of runs 1.5-3.5x; default: default)",
    )


def refuse_a_workload_past(limit: int, args: WorkloadOptions, workload: Workload, models: int, seconds: float) -> None:
    """A rate or scale mistyped by orders of magnitude is told at once, from the arrivals the workload
    expects in ``seconds``: generating them first filled the memory (2 GB, a minute) before the refusal."""
    expected = workload.expected_arrivals(models, s_to_ns(seconds))
    if expected is None or expected <= limit:
        return
    flag = {"azure": f"--trace-scale {args.trace_scale:g}", "closed": f"--clients {args.clients} x --outstanding "
            f"{args.outstanding}"}.get(args.workload, f"--rate {args.rate:g}")  # fmt: skip
    about = {"poisson": "", "slo-sweep": "", "closed": "up to "}.get(args.workload, "about ")
    raise CliError(f"{flag} for {seconds:g} s is {about}{expected:.3g} requests; a run holds at most {limit:,}")


def refuse_pools_past(devices: int, pool_bytes: int, page_bytes: int) -> None:
    """Pools whose pages, over every device, are more than a run keeps track of, told at once."""
    pages = devices * (pool_bytes // page_bytes)
    if pages > MAX_POOL_PAGES:
        pool = f"--device-memory-gib {pool_bytes / 2**30:g} in pages of --page-mib {page_bytes // MIB}"
        raise CliError(f"{devices} devices of {pool} are {pages:,} pages; a run holds at most {MAX_POOL_PAGES:,}")


def duration_s(args: argparse.Namespace) -> float:
    """``--duration-s``, or the default for the chosen workload."""
    if args.duration_s is not None:
        return float(args.duration_s)
    return float(args.azure_duration_s) if args.workload == "azure" else DEFAULT_DURATION_S


def _replay_start_minute(args: WorkloadOptions) -> int:
    """Where the replay begins: a warm-up (``simulate --warmup-s``) replays the minutes before the window."""
    warmup_s = getattr(args, "warmup_s", 0.0)
    minutes, rest = divmod(warmup_s, 60)
    if rest:
        raise CliError(f"--warmup-s with the azure workload must be whole minutes, got {warmup_s:g}")
    if minutes > args.trace_start_minute:
        raise CliError(
            f"--warmup-s {warmup_s:g} replays {minutes:g} minute(s) before --trace-start-minute "
            f"{args.trace_start_minute}; the trace has no minute before 0"
        )
    return int(args.trace_start_minute - minutes)


def workload_from(args: WorkloadOptions) -> Workload:
    name = args.workload
    if name == "azure":
        return AzureTrace(args.trace, args.trace_scale, _replay_start_minute(args))
    if name == "poisson":
        return PoissonOpenLoop(args.rate, args.popularity)
    if name == "bursty":
        return BurstyOnOff(args.rate)
    if name == "closed":
        return ClosedLoop(args.clients, args.outstanding)
    if name == "slo-sweep":
        return SloSweep(
            PoissonOpenLoop(args.rate, args.popularity), growth=args.sweep_growth, interval_s=args.sweep_interval_s
        )
    raise CliError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
