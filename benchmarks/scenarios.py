"""Mainspring beside Triton and Ray Serve on this machine: scenarios S1-S5, one table in BENCHMARKS.md.

Every server serves the same models (files exported from the zoo, built by the same code) and
gets the identical arrival sequence for each point, sent by ``mainspring bench``'s open-loop
driver over KServe v2 HTTP with binary tensors, each request carrying its SLO as ``timeout``.
Servers of one scenario run one after another (never two at once: client, server and worker
share the machine's 2 cores), each after a short warm-up load that is not counted.

- S1 tail under load: the zoo's resnet18 (64x64), Poisson at 50 / 80 / 95% of capacity, SLO 10x batch 1;
  then a closed loop of 16 clients, each server's own ceiling.
- S2 bursts: the same model, on/off bursts (1 s on, 4 s off on average) at 3x capacity.
- S3 many models, limited memory: 30 resnet18 copies at 64x64, Zipf, 20 / 40 / 60 r/s, SLO 100
  ms; Mainspring's weight pool holds 10 of them (480 MiB), each peer holds at most 10.
- S4 Azure replay: the bundled Functions sample at x2 and x6 over the built-in zoo, SLO 100 ms.
- S5 tight SLOs: resnet18 64x64 at 50% of capacity, SLO 2x to 40x batch 1: the smallest SLO
  each server holds at 99%.

Capacity and batch-1 time are measured here first (single-threaded forward passes of the
model, like one CPU worker), stored in the results, and reused by later runs and repeats so
that every server and repeat sees the same loads.

    .venv/bin/python benchmarks/scenarios.py [--scenarios S1,S2] [--servers mainspring,triton-expert]
        [--repeats 1] [--seconds 30] [--markdown BENCHMARKS.md]   # --markdown-only: rewrite it from the results
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
from launch import SERVERS, start  # noqa: E402

from mainspring.bench.driver import Sent, drive  # noqa: E402
from mainspring.bench.report import as_recorder, build  # noqa: E402
from mainspring.models.loading import copy_model, export_zoo_model  # noqa: E402
from mainspring.models.profile import ModelProfile  # noqa: E402
from mainspring.models.repository import ModelRepository  # noqa: E402
from mainspring.serving.config import DEFAULT_ZOO  # noqa: E402
from mainspring.time import ms_to_ns, s_to_ns  # noqa: E402
from mainspring.workload import AzureTrace, BurstyOnOff, ClosedLoop, PoissonOpenLoop, Workload  # noqa: E402
from scenario_report import write_markdown  # noqa: E402

OUT = ROOT / "out" / "scenarios"
RESULTS = OUT / "results.json"
SCENARIOS = ("S1", "S2", "S3", "S4", "S5")
S3_POOL_MIB = 480
DEFAULT_POOL_MIB = 1024
S5_FACTORS = (2, 3, 5, 10, 20, 40)


@dataclass
class Point:
    label: str
    workload: Workload
    slo_ms: float
    seconds: float


@dataclass
class Scenario:
    key: str
    repo: Path
    pool_mib: int
    resident: int | None
    points: list[Point]


def build_repo(name: str) -> Path:
    """The scenario's model repository under out/scenarios/repos (built once)."""
    path = OUT / "repos" / name
    if (path / ".complete").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    repo = ModelRepository(path)
    if name == "resnet18":
        export_zoo_model(repo, "resnet18")  # the zoo's: 64x64
    elif name == "resnet18-64x30":
        export_zoo_model(repo, "resnet18", args={"image_size": 64}, served_as="resnet18-00")
        for i in range(1, 30):
            copy_model(repo, "resnet18-00", f"resnet18-{i:02d}")
    elif name == "zoo":
        for model in DEFAULT_ZOO:
            export_zoo_model(repo, model)
    (path / ".complete").touch()
    return path


def calibrate(repo: Path) -> dict[str, float]:
    """Batch-1 time, the largest batch's time, capacity (r/s at the largest batch) and weight MiB of
    the repository's first model: medians of single-threaded forward passes in a fresh process."""
    code = f"""
import json, time, statistics, torch
from mainspring.models.loading import load_module, state_tensors
from mainspring.models.repository import ModelRepository
from mainspring.models.zoo import example_inputs
torch.set_num_threads(1)
repo = ModelRepository({str(repo)!r}); model = repo.models()[0]
config, module = load_module(repo, model)
def median_ms(size):
    inputs = example_inputs(config.inputs, size)
    times = []
    with torch.inference_mode():
        for i in range(25):
            t = time.perf_counter(); module(*inputs); times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times[5:])
one, full = median_ms(1), median_ms(config.max_batch)
mib = sum(t.nbytes for t in state_tensors(module).values()) / 2**20
print(json.dumps({{"batch1_ms": one, "max_batch_ms": full, "max_batch": config.max_batch,
                  "capacity_rps": 1000 * config.max_batch / full, "weights_mib": mib}}))
"""
    out = subprocess.check_output([sys.executable, "-c", code], text=True)
    return dict(json.loads(out.strip().splitlines()[-1]))


def scenarios(selected: Sequence[str], seconds: float, calibration: dict[str, Any]) -> list[Scenario]:
    def cal(repo: str) -> dict[str, float]:
        if repo not in calibration:
            calibration[repo] = calibrate(build_repo(repo))
            print(f"calibrated {repo}: {calibration[repo]}", flush=True)
        return dict(calibration[repo])

    out = []
    for key in selected:
        if key in ("S1", "S2"):
            c = cal("resnet18")
            slo = round(10 * c["batch1_ms"])
            if key == "S1":
                points = [Point(f"{p:.0%}", PoissonOpenLoop(p * c["capacity_rps"]), slo, seconds)
                          for p in (0.5, 0.8, 0.95)]  # fmt: skip
                # each server's own ceiling: 16 clients, each sending again as soon as it is answered
                points.append(Point("closed loop", ClosedLoop(16), slo, seconds))
            else:
                points = [Point("3x bursts", BurstyOnOff(3 * c["capacity_rps"], 1.0, 4.0), slo, 2 * seconds)]
            out.append(Scenario(key, build_repo("resnet18"), DEFAULT_POOL_MIB, None, points))
        elif key == "S3":
            c = cal("resnet18-64x30")
            points = [Point(f"{r} r/s", PoissonOpenLoop(r, "zipf"), 100.0, seconds) for r in (20, 40, 60)]
            out.append(Scenario(key, build_repo("resnet18-64x30"), S3_POOL_MIB, int(S3_POOL_MIB // c["weights_mib"]),
                                points))  # fmt: skip
        elif key == "S4":
            points = [Point(f"azure x{x}", AzureTrace(scale=x), 100.0, 2 * seconds) for x in (2, 6)]
            out.append(Scenario(key, build_repo("zoo"), DEFAULT_POOL_MIB, None, points))
        elif key == "S5":
            c = cal("resnet18")
            load = PoissonOpenLoop(0.5 * c["capacity_rps"])
            points = [Point(f"{f}x", load, round(f * c["batch1_ms"], 1), seconds * 2 / 3) for f in S5_FACTORS]
            out.append(Scenario(key, build_repo("resnet18"), DEFAULT_POOL_MIB, None, points))
        else:
            raise SystemExit(f"unknown scenario {key!r}; choose from {', '.join(SCENARIOS)}")
    return out


def burst_recovery_ms(rows: Sequence[Sent], gap_ms: float = 500.0) -> list[float]:
    """For each burst (arrivals separated by more than ``gap_ms`` of silence): the time from its
    last arrival until its last request was answered, i.e. until the server had caught up."""
    ordered = sorted(rows, key=lambda r: r.scheduled_ns)
    bursts: list[list[Sent]] = []
    for row in ordered:
        if not bursts or row.scheduled_ns - bursts[-1][-1].scheduled_ns > ms_to_ns(gap_ms):
            bursts.append([])
        bursts[-1].append(row)
    return [(max(r.answered_ns for r in b) - b[-1].scheduled_ns) / 1e6 for b in bursts]


async def run_point(url: str, models: list[str], point: Point, seed: int) -> tuple[dict[str, Any], list[Sent]]:
    from mainspring.bench.senders import HttpSender

    sender = HttpSender(url)
    try:
        await sender.prepare(models)
        profiles = [ModelProfile(m, "live", 1, 1, {1: 1}) for m in models]
        duration = s_to_ns(point.seconds)
        arrivals = point.workload.arrivals(profiles, duration, random.Random(seed))
        result = await drive(arrivals, point.workload, sender, ms_to_ns(point.slo_ms), duration)
    finally:
        await sender.close()
    return build(result), result.sent


def summary(report: dict[str, Any], rows: Sequence[Sent], bursts: bool) -> dict[str, Any]:
    keep = ("requests", "offered_rps", "goodput_rps", "slo_attainment", "late", "rejected", "timed_out", "errors")
    out = {k: report[k] for k in keep}
    out["p50_ms"], out["p99_ms"] = report["latency_ms"]["p50"], report["latency_ms"]["p99"]
    out["send_lag_p99_ms"] = report["send_lag_ms"]["p99"]
    out["reasons"] = dict(list(report["reasons"].items())[:4])
    if bursts:
        recovery = burst_recovery_ms(rows)
        out["recovery_ms"] = {"median": statistics.median(recovery), "max": max(recovery)}
    return out


def run_scenario(scenario: Scenario, servers: Sequence[str], results: dict[str, Any], plots: bool) -> None:
    models = ModelRepository(scenario.repo).models()
    first = scenario.points[0]
    warm_up = Point("warm-up", first.workload, first.slo_ms, 8.0)  # the first point's load, another seed
    recorders: dict[str, dict[str, Any]] = {}
    for server in servers:
        log = OUT / "logs" / f"{scenario.key}-{server}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        process = start(server, scenario.repo, log, scenario.pool_mib, scenario.resident)
        started = time.monotonic()
        try:
            process.wait_ready()
            print(f"{scenario.key} {server}: ready in {time.monotonic() - started:.0f} s", flush=True)
            asyncio.run(run_point(process.http, models, warm_up, 0))
            for index, point in enumerate(scenario.points):
                report, rows = asyncio.run(run_point(process.http, models, point, 100 + index))
                row = summary(report, rows, scenario.key == "S2")
                results.setdefault(scenario.key, {}).setdefault(point.label, {}).setdefault(server, []).append(
                    {**row, "slo_ms": point.slo_ms})  # fmt: skip
                recorders.setdefault(point.label, {})[server] = as_recorder(rows)
                print(f"  {point.label:>10} {server:<14} attainment {row['slo_attainment']:8.3%} goodput "
                      f"{row['goodput_rps']:6.1f} r/s p99 {row['p99_ms']:7.1f} ms", flush=True)  # fmt: skip
        finally:
            process.stop()
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    if plots:
        from mainspring.telemetry.plots import write_plots

        for label, runs in recorders.items():
            slo = next(p.slo_ms for p in scenario.points if p.label == label)
            folder = ROOT / "docs" / "scenarios" / f"{scenario.key}-{label.replace(' ', '-').replace('/', '')}"
            write_plots(runs, folder, slo)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--servers", default="mainspring,triton-expert,ray-expert",
                        help=f"from {', '.join(SERVERS)}")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds per point (S2, S4: twice)")
    parser.add_argument("--plots", action="store_true", help="write the latency plots into docs/scenarios/")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results (keep the calibration)")
    parser.add_argument("--markdown-only", action="store_true", help="only rewrite the table from the results")
    parser.add_argument("--markdown", type=Path, default=ROOT / "BENCHMARKS.md", help="where the table goes")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if args.fresh:
        results = {"calibration": results.get("calibration", {})}
    if not args.markdown_only:
        calibration = results.setdefault("calibration", {})
        chosen = scenarios([s.strip() for s in args.scenarios.split(",")], args.seconds, calibration)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        results.setdefault("runs", []).append({"started": time.strftime("%Y-%m-%d %H:%M"), "servers": args.servers,
                                               "scenarios": args.scenarios, "seconds": args.seconds,
                                               "repeats": args.repeats, "commit": commit.stdout.strip()})  # fmt: skip
        for repeat in range(args.repeats):
            for scenario in chosen:
                servers = args.servers.split(",")
                # alternate the order between repeats: slow drift of the machine hits every server alike
                run_scenario(scenario, servers if repeat % 2 == 0 else servers[::-1], results,
                             args.plots and repeat == args.repeats - 1)  # fmt: skip
    write_markdown(results, args.markdown)


if __name__ == "__main__":
    main()
