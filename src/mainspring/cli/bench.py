"""``mainspring bench``: the simulator's workloads, sent on schedule to a running KServe v2 server."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

from mainspring.cli.values import server_address
from mainspring.cli.workload import (
    CliError,
    add_workload_arguments,
    duration_s,
    prepare_outputs,
    refuse_a_workload_past,
    workload_from,
)
from mainspring.protocol.requests import slo_problem
from mainspring.time import NS_PER_S, ms_to_ns, s_to_ns
from mainspring.workload.base import MAX_ARRIVALS


def add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("bench", help="send a workload on schedule to a KServe v2 server and report")
    p.add_argument(
        "--url", type=server_address, help="server address (default 127.0.0.1:8000 for http, 127.0.0.1:8001 for grpc)"
    )
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--models", help="comma-separated model names (default: every ready model of the server)")
    add_workload_arguments(p, default="poisson", rate=50.0)
    p.add_argument("--json", type=Path, help="write the report as JSON here")
    p.add_argument("--log", type=Path, help="write the request log (TSV) here")
    p.add_argument("--plot", type=Path, help="write PNG plots (latency CDF, goodput and latency over time) here")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def run_bench(args: argparse.Namespace) -> int:
    if (problem := slo_problem("--slo-ms", args.slo_ms)) is not None:
        raise CliError(problem)
    prepare_outputs({"--json": args.json, "--log": args.log}, {"--plot": args.plot})
    report = asyncio.run(_bench(args))
    from mainspring.bench.report import format_report

    print(format_report(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from mainspring.bench.driver import drive
    from mainspring.bench.report import build, write_log
    from mainspring.bench.senders import BenchError, GrpcSender, HttpSender
    from mainspring.models.profile import ModelProfile

    token = os.environ.get("MAINSPRING_AUTH_TOKEN", "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = args.url or ("127.0.0.1:8001" if args.protocol == "grpc" else "127.0.0.1:8000")
    workload = workload_from(args)  # a bad workload flag is told before the server is asked anything
    named = [m.strip() for m in args.models.split(",") if m.strip()] if args.models is not None else None
    if named == []:
        raise CliError(f"--models {args.models!r} names no model")
    # The driver keeps a record of every request: a rate mistyped as 1e9 flooded the server and filled the memory.
    refuse_a_workload_past(MAX_ARRIVALS, args, workload, len(named or [""]), duration_s(args))
    sender = GrpcSender(url, headers) if args.protocol == "grpc" else HttpSender(url, headers)
    try:
        models = named if named is not None else await _ready_models(url, headers)
        try:
            await sender.prepare(models)
        except (BenchError, OSError) as error:
            raise CliError(str(error)) from None
        # The workloads draw models from profiles; only names matter to them here.
        profiles = [ModelProfile(m, "live", 1, 1, {1: 1}) for m in models]
        duration = s_to_ns(duration_s(args))
        arrivals = workload.arrivals(profiles, duration, random.Random(args.seed))

        def progress(now_ns: int, answered: int) -> None:
            if not args.quiet:
                print(f"\r{now_ns / NS_PER_S:6.1f} s  {answered} answered", end="", file=sys.stderr, flush=True)

        result = await drive(arrivals, workload, sender, ms_to_ns(args.slo_ms), duration, progress)
        if not args.quiet:
            print(file=sys.stderr)
    finally:
        await sender.close()
    if args.log is not None:
        write_log(result.sent, args.log)
    if args.plot is not None:
        from mainspring.bench.report import as_recorder
        from mainspring.telemetry.plots import write_plots

        write_plots({url: as_recorder(result.sent)}, args.plot, args.slo_ms)
    report = build(result)
    report["settings"] = {"url": url, "protocol": args.protocol, "models": models, "workload": workload.describe(),
                          "duration_s": duration_s(args), "slo_ms": args.slo_ms, "seed": args.seed}  # fmt: skip
    return report


async def _ready_models(url: str, headers: dict[str, str]) -> list[str]:
    import aiohttp

    base = url if url.startswith("http") else f"http://{url}"
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{base}/v2/repository/index", json={"ready": True}, headers=headers) as response,
        ):
            index = await response.json()
    except (aiohttp.ClientError, ValueError) as error:
        raise CliError(f"cannot list the models of {base}: {error}; name them with --models") from None
    models = [m["name"] for m in index if m.get("state") == "READY"]
    if not models:
        raise CliError(f"{base} serves no ready model")
    return models
