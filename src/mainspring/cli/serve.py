"""``mainspring serve`` and ``mainspring worker``."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mainspring.cli.values import (
    MAX_CORE,
    MAX_DEVICES,
    MAX_MODELS,
    MAX_PID,
    MAX_POOL_MIB,
    MAX_PROFILES_BYTES,
    MAX_SLO_MS,
    PORT,
    POSITIVE_SECONDS,
    SECONDS,
    SLO_MS,
    bounded_int,
    endpoint,
    finite_float,
    input_path,
)
from mainspring.cli.workload import CliError, add_noise_argument


def add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("serve", help="run the server: KServe v2 HTTP + gRPC, controller, local workers")
    p.add_argument("--config", type=Path, help="TOML file with serve settings (a [serve] table or top-level keys)")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--http-port", type=PORT, help="HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=PORT, help="gRPC port (default 8001)")
    p.add_argument("--worker-port", type=PORT, help="port workers connect to (default 8002)")
    p.add_argument("--workers", choices=("local", "tcp"), help="start local workers (default) or wait for tcp ones")
    p.add_argument("--ray", nargs="?", const="auto",
                   help="place one worker per device of a Ray cluster (ADDRESS, default: the local one)")  # fmt: skip
    p.add_argument(
        "--cells",
        type=bounded_int(0, MAX_DEVICES),
        help="controller processes, each planning its share of the devices (default: a cell per 16 devices, "
        "at most one per 2 cores; cell i takes workers on worker-port + i); with --ray a cell per node, N the "
        "cells serving waits for",
    )
    p.add_argument("--frontends", type=bounded_int(0, 256),
                   help="HTTP + gRPC processes on the ports (default: 1 per 2 cores, up to 4)")  # fmt: skip
    p.add_argument("--repo", help="model repository (default ~/.mainspring/zoo, built on first start)")
    p.add_argument("--policy", help="scheduling policy (default clockwork)")
    p.add_argument("--slo-ms", type=SLO_MS, help="default SLO in ms (default 100)")
    p.add_argument(
        "--deadline-margin-ms",
        type=finite_float(0, MAX_SLO_MS),
        help="plan batches to end this long before the deadline (default 1)",
    )
    p.add_argument(
        "--clockwork",
        action="append",
        metavar="KEY=VALUE",
        help="a clockwork policy setting, e.g. estimate_percentile=90 (repeatable; docs/serving.md)",
    )
    p.add_argument("--devices", help="local devices, comma-separated (default: every CUDA GPU, else cpu)")
    p.add_argument("--pool-mib", type=bounded_int(0, MAX_POOL_MIB), help="weight pool per device in MiB")
    p.add_argument("--log-dir", help="write request and action logs (TSV) here, for `mainspring analyze`")
    p.add_argument("--repository-poll-s", type=SECONDS,
                   help="every this many s, serve what changed in the repository (default 0: off)")  # fmt: skip
    p.add_argument(
        "--pin-cpu-workers",
        action="store_true",
        default=None,
        help="pin each local CPU worker's exec thread to its own core",
    )
    p.add_argument(
        "--allow-open-workers",
        action="store_true",
        default=None,
        help="without worker_secret, let any process that reaches worker-port join as a worker (it gets "
        "clients' inputs and answers for the models); --workers tcp needs a secret or this",
    )


def add_worker(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("worker", help="run a worker that connects to a controller")
    p.add_argument("--controller", required=True, type=endpoint,
                   help="controller, tcp://HOST:PORT (its worker_secret in $MAINSPRING_WORKER_SECRET)")  # fmt: skip
    p.add_argument("--device", default="cpu", help="cpu or cuda:N (default cpu)")
    p.add_argument("--repo", type=Path, help="model repository (not with --emulate)")
    p.add_argument("--emulate", nargs="?", const="builtin", metavar="PROFILES", type=_profiles_source,
                   help="emulated devices instead of a real one: profile-driven durations, no compute, each model "
                        "echoing its input; PROFILES a profile file or profiled repository (default: Clockwork's "
                        "V100 profiles)")  # fmt: skip
    p.add_argument("--count", type=bounded_int(1, MAX_DEVICES), default=1,
                   help="with --emulate: how many devices (default 1)")  # fmt: skip
    p.add_argument("--models", type=bounded_int(1, MAX_MODELS),
                   help="with --emulate: this many copies of the profiles, <model>-<i>")  # fmt: skip
    add_noise_argument(p, "with --emulate:")
    p.add_argument("--pool-mib", type=bounded_int(0, MAX_POOL_MIB),
                   help="weight pool in MiB (default: 2048 on cpu; a GPU's sized after "
                        "registration; 32 GiB emulated)")  # fmt: skip
    p.add_argument("--name", help="worker name (default host:pid)")
    p.add_argument("--parent-pid", type=bounded_int(1, MAX_PID), help="exit when this process is gone")
    p.add_argument("--pin-core", type=bounded_int(0, MAX_CORE), help="pin the exec lane's thread to this CPU core")
    p.add_argument("--rejoin", action="store_true",
                   help="with --parent-pid: when the controller goes, say hello again to the next one on its "
                        "address, keeping the weights (without --parent-pid it always does)")  # fmt: skip
    p.add_argument("--controller-timeout-s", type=POSITIVE_SECONDS, default=3.0,
                   help="start over to join again when the controller is silent this long (default 3)")  # fmt: skip


def _profiles_source(text: str) -> str:
    """``--emulate``'s profiles, checked as ``--profiles`` are (a bare ``--emulate``: the builtin ones; argparse
    passes its ``const`` through this too)."""
    if text == "builtin":
        return text
    return str(input_path(MAX_PROFILES_BYTES, folder_too=True)(text))


def run_serve(args: argparse.Namespace) -> int:
    from mainspring.serving.config import load_config
    from mainspring.serving.server import run_server

    flags: dict[str, Any] = {
        key: getattr(args, key)
        for key in (
            "host",
            "http_port",
            "grpc_port",
            "worker_port",
            "workers",
            "frontends",
            "cells",
            "ray",
            "repo",
            "policy",
            "slo_ms",
            "deadline_margin_ms",
            "devices",
            "pool_mib",
            "log_dir",
            "repository_poll_s",
            "pin_cpu_workers",
            "allow_open_workers",
        )
    }
    config = load_config(args.config, dict(os.environ), flags, args.clockwork)
    config = dataclasses.replace(config, cells=config.cell_count())
    if config.cells > 1 and config.ray:
        from mainspring.serving.ray_cells import run_ray_cells

        return run_ray_cells(config)
    if config.cells > 1:
        from mainspring.serving.local_cells import run_cells

        return run_cells(config)
    return run_server(config)


def run_worker(args: argparse.Namespace) -> int:
    from mainspring.protocol import ActionResult
    from mainspring.transport.security import SECRET_ENV
    from mainspring.worker.api import Worker
    from mainspring.worker.process import START_OVER, WorkerConnection

    if (args.repo is None) == (args.emulate is None):
        raise CliError("give --repo (a real device's models) or --emulate (emulated devices), not both")
    if args.count < 1 or (args.emulate is None and (args.count != 1 or args.models is not None)):
        raise CliError("--count (at least 1) and --models go with --emulate")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    def start_over(reason: str) -> None:  # a lost CUDA context (``connection`` exists by the time it is told)
        connection.start_over(reason)

    make_worker: Callable[[Callable[[ActionResult], None]], Worker] = (
        _emulated_worker(args) if args.emulate is not None else _torch_worker(args, start_over)
    )
    connection = WorkerConnection(
        args.controller,
        make_worker,
        name=args.name,
        secret=os.environ.get(SECRET_ENV, ""),
    )
    signal.signal(signal.SIGTERM, lambda *_: connection.stop())
    signal.signal(signal.SIGINT, lambda *_: connection.stop())
    # A remote worker outlives its controller: it rejoins whichever controller binds the address next,
    # keeping its weights; a local one exits with its parent (or is restarted by it).
    remote = args.parent_pid is None
    outcome = connection.serve(args.parent_pid, args.controller_timeout_s, rejoin=remote or args.rejoin)
    if outcome == START_OVER and remote:
        # A hung lane or a lost CUDA context: only a fresh process (an empty weight pool, nothing in flight) recovers.
        logging.getLogger(__name__).warning("starting over in a fresh process")
        os.execv(sys.executable, [sys.executable, "-m", "mainspring.cli", *sys.argv[1:]])
    if (
        args.parent_pid is not None
    ):  # a local worker: its parent starts another; a hung lane thread must not hold the exit
        logging.shutdown()
        os._exit(0)
    return 0


def _torch_worker(args: argparse.Namespace, on_lost: Callable[[str], None]) -> Callable[[Any], Any]:
    """A real device's worker, made once the connection can be told its CUDA context is lost (``on_lost``)."""
    from mainspring.models.repository import ModelRepository
    from mainspring.protocol.pages import MIB
    from mainspring.worker.heap import freeze_startup_heap
    from mainspring.worker.runtimes.torch_device import ExecSettings
    from mainspring.worker.torch_worker import TorchWorker

    repo = ModelRepository(args.repo)
    pool = args.pool_mib * MIB if args.pool_mib else None
    settings = ExecSettings(pin_core=args.pin_core)
    freeze_startup_heap(repo, repo.models())  # before any model is registered: those must stay collectable
    return lambda sink: TorchWorker(repo, sink, [args.device], pool_bytes=pool, settings=settings, on_lost=on_lost)


def _emulated_worker(args: argparse.Namespace) -> Callable[[Any], Any]:
    """``--count`` emulated devices of the profiles' kind serving ``--emulate``'s profiles (``--models`` copies)."""
    from mainspring.models.profile import model_copies
    from mainspring.models.repository import profiles_from
    from mainspring.protocol import DeviceSpec
    from mainspring.protocol.pages import DEFAULT_POOL_BYTES, MIB
    from mainspring.worker.emulated_worker import EmulatedWorker
    from mainspring.worker.runtimes.emulated import NoiseModel

    try:
        profiles = profiles_from(None if args.emulate == "builtin" else Path(args.emulate))
    except ValueError as error:  # no profiles there, or a file that holds none
        raise CliError(f"--emulate {args.emulate}: {error}") from None
    if args.models is not None:
        profiles = model_copies(profiles, args.models)
    kinds = sorted({p.device_kind for p in profiles})
    if len(kinds) > 1:
        raise CliError(f"--emulate {args.emulate}: profiles of {len(kinds)} device kinds ({', '.join(kinds)}); "
                       "one worker emulates one kind")  # fmt: skip
    pool = args.pool_mib * MIB if args.pool_mib else DEFAULT_POOL_BYTES
    specs = [DeviceSpec(i, kinds[0], pool) for i in range(args.count)]
    noise = NoiseModel.named(args.noise)
    by_name = {p.model: p for p in profiles}
    logging.getLogger(__name__).info("emulating %d %s device(s) serving %d models", args.count, kinds[0], len(by_name))
    return lambda sink: EmulatedWorker(specs, by_name, sink, noise)
