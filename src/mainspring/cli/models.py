"""``mainspring zoo export`` and ``mainspring profile``: torch is imported only when they run."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from mainspring.cli.values import bounded_int, finite_float
from mainspring.cli.workload import CliError, prepare_outputs
from mainspring.time import ns_to_ms

ZOO_FORMATS = ("torch_export", "torchscript", "safetensors", "onnx")
MAX_BATCH = 4096


def add_zoo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    zoo = commands.add_parser("zoo", help="the built-in model zoo")
    actions = zoo.add_subparsers(dest="zoo_command", required=True)
    p = actions.add_parser("export", help="write zoo models (seeded random weights) into a model repository")
    p.add_argument("--out", type=Path, required=True, help="repository folder (created if missing)")
    p.add_argument("--models", default="resnet18,resnet50,mobilenetv2,bert_tiny,mlp", help="comma-separated names")
    p.add_argument(
        "--copies", type=bounded_int(1, 100_000), default=1, help="copies of each model, named <model>-<i> (default 1)"
    )
    p.add_argument(
        "--image-size", type=bounded_int(16, 4096), default=64, help="image side for the vision models (default 64)"
    )
    p.add_argument("--format", default="torch_export", choices=ZOO_FORMATS, help="model file format")
    p.add_argument("--batch-sizes", default="1,2,4,8", help="supported batch sizes (default 1,2,4,8)")


def add_profile(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("profile", help="measure load and exec times of a repository's models")
    p.add_argument("repo", type=Path, help="model repository folder")
    p.add_argument("--model", action="append", help="profile only this model (repeatable)")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N (default cpu)")
    p.add_argument(
        "--max-runs", type=bounded_int(1, 1_000_000), default=400, help="most timed runs per batch size (default 400)"
    )
    p.add_argument(
        "--max-seconds",
        type=finite_float(0, 3600, low_open=True),
        default=5.0,
        help="time budget per batch size (default 5 s)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--from-log",
        type=Path,
        metavar="DIR",
        help="instead of measuring: recalibrate the stored profiles to a served run's medians (serve --log-dir DIR)",
    )
    p.add_argument("--run", help="with --from-log: the run's name (default: the last in DIR)")


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise CliError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or any(not 0 < v <= MAX_BATCH for v in values):
        raise CliError(f"{flag} must list integers in [1, {MAX_BATCH}], got {text[:40]!r}")
    return sorted(set(values))


def run_zoo(args: argparse.Namespace) -> int:
    from mainspring.models.loading import copy_model, export_zoo_model
    from mainspring.models.repository import ModelRepository
    from mainspring.models.zoo import ARCHITECTURES

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in ARCHITECTURES]
    if unknown or not names:
        raise CliError(f"unknown zoo model(s) {unknown}; choose from {', '.join(ARCHITECTURES)}")
    if args.copies <= 0 or args.image_size < 16:
        raise CliError("--copies must be positive and --image-size at least 16")
    batch_sizes = _int_list(args.batch_sizes, "--batch-sizes")
    prepare_outputs({}, {"--out": args.out})
    repo = ModelRepository(args.out)
    width = len(str(args.copies - 1))
    for name in names:
        arch_args = {"image_size": args.image_size} if "image_size" in ARCHITECTURES[name].defaults else {}
        first = name if args.copies == 1 else f"{name}-{0:0{width}d}"
        config = export_zoo_model(repo, name, fmt=args.format, args=arch_args, batch_sizes=batch_sizes, served_as=first)
        _refuse_copies_past_the_disk(args, name, repo.path(first) / config.file)
        for i in range(1, args.copies):
            copy_model(repo, first, f"{name}-{i:0{width}d}")
        print(f"{name}: {args.copies} model(s) in {args.out} ({args.format})")
    return 0


def _refuse_copies_past_the_disk(args: argparse.Namespace, name: str, exported: Path) -> None:
    """Each copy is another file like ``exported``: told before the copies fill the disk."""
    needed = exported.stat().st_size * (args.copies - 1)
    free = shutil.disk_usage(exported.parent).free
    if needed > free:
        raise CliError(f"--copies {args.copies} of {name} need {needed / 2**30:.3g} GiB; "
                             f"{free / 2**30:.3g} GiB is free at --out {args.out}")  # fmt: skip


def run_profile(args: argparse.Namespace) -> int:
    if args.from_log is not None:
        return _recalibrate(args)
    if args.run is not None:
        raise CliError("--run names a run of --from-log's logs; give --from-log too")
    from tqdm import tqdm

    from mainspring.models.errors import ModelLoadError
    from mainspring.models.profiler import ActionRunner, ProfilerSettings, measure_exec, measure_load, profile_from
    from mainspring.models.repository import ModelRepository
    from mainspring.protocol import LoadWeights
    from mainspring.worker.torch_worker import TorchWorker

    repo = ModelRepository(args.repo)
    held = repo.models()
    if not held:
        raise CliError(f"repository {args.repo} holds no models")
    models = args.model or held
    unknown = sorted(set(models) - set(held))
    if unknown:
        raise CliError(f"--model {', '.join(unknown)}: not in {args.repo}, which holds {', '.join(held)}")
    try:
        settings = ProfilerSettings(max_runs=args.max_runs, max_seconds_per_batch=args.max_seconds)
    except ValueError:  # the settings' own check, told in the flags' names
        raise CliError(f"--max-runs must be at least 1 and --max-seconds positive, got {args.max_runs} and "
                             f"{args.max_seconds:g}") from None  # fmt: skip
    runner = ActionRunner()
    worker = TorchWorker(repo, runner.results.put, [args.device], models=[], use_stored_profiles=False)
    rows, failures = [], 0
    try:
        for model in tqdm(models, desc="profiling", unit="model", disable=args.quiet, file=sys.stderr):
            try:
                provisional = worker.register(model)
            except ModelLoadError as error:
                print(f"skipped: {error}", file=sys.stderr)
                failures += 1
                continue
            config = worker.configs()[model]
            loads = measure_load(runner, worker.submit, model, settings.load_runs)
            runner.run(worker.submit, LoadWeights, model)
            worker.settle()  # its CUDA graphs are in: time replays, not eager runs beside a capture
            batches = [measure_exec(runner, worker.submit, config, b, settings) for b in config.batch_sizes]
            worker.unregister(model)
            profile = profile_from(provisional, loads, batches)
            repo.write_profile(profile)
            cells = " ".join(f"b{m.batch}={ns_to_ms(m.p50_ns):.2f}/{ns_to_ms(m.p99_ns):.2f}" for m in batches)
            rows.append(
                f"{model:<24} {profile.device_kind:<10} load {ns_to_ms(profile.load_ns):7.2f} ms  "
                f"exec p50/p99 ms: {cells}"
            )
    finally:
        worker.close()
    print("\n".join(rows))
    print(f"profiles written into {args.repo}/<model>/<version>/profile.json")
    return 1 if failures else 0


def _recalibrate(args: argparse.Namespace) -> int:
    """``profile REPO --from-log DIR``: the stored profiles of the models the run served, rewritten
    with the run's medians (``telemetry/profile_recalibration.py``)."""
    from mainspring.models.repository import ModelRepository
    from mainspring.telemetry.analyze import LogError, read_run, runs
    from mainspring.telemetry.profile_recalibration import ServedLogError, recalibrated, served_durations, slowdown_of

    found = runs(args.from_log) if args.from_log.is_dir() else []
    if not found:
        raise CliError(f"--from-log {args.from_log}: no run logs (<run>-requests.tsv and <run>-actions.tsv)")
    run = args.run or found[-1]
    if run not in found:
        raise CliError(f"--run {run}: not in {args.from_log}, which holds {', '.join(found)}")
    try:
        served = served_durations(read_run(args.from_log, run)[1].values())
    except (LogError, ServedLogError) as error:
        raise CliError(f"--from-log {args.from_log}, run {run}: {error}") from None
    repo = ModelRepository(args.repo)
    profiles = [p for p in repo.all_profiles() if p.model in served and (not args.model or p.model in args.model)]
    kinds = sorted({p.device_kind for p in profiles})
    if len(kinds) != 1:
        held = f"of {', '.join(kinds)}" if kinds else "none"
        raise CliError(f"--from-log needs stored profiles of one device kind for the models {run} served: {held}")
    try:  # every profile checked before the first is written
        slowdown = slowdown_of(profiles, served)
        updated = [(old, recalibrated(old, served[old.model], slowdown)) for old in profiles]
    except ServedLogError as error:
        raise CliError(f"--from-log {args.from_log}, run {run}: {error}; no profile written") from None
    for old, new in updated:
        repo.write_profile(new)
        cells = " ".join(f"b{b}={ns_to_ms(old.exec_ns[b]):.2f}->{ns_to_ms(ns):.2f}" for b, ns in new.exec_ns.items())
        print(f"{old.model:<24} load {ns_to_ms(old.load_ns):.2f}->{ns_to_ms(new.load_ns):.2f} ms  exec ms: {cells}")
    print(f"{len(profiles)} profile(s) recalibrated to run {run} (served {slowdown:.2f}x the profiled times)")
    return 0
