"""``mainspring plan`` checked live: the planned pool and the next size down, served and measured.

On this machine's CPU, for the many-models workload (30 copies of resnet18 at 64x64, Poisson with
Zipf popularity, SLO 100 ms):

1. profiles one copy with ``mainspring profile`` (copies share it);
2. recalibrates that profile to serving (``--calibrate-rate``, default 40 r/s): serves every model
   resident for ``--calibrate-s`` with ``serve --log-dir``, then ``mainspring profile --from-log``
   takes the worker's served medians (batches run 7-18% slower served than profiled alone here);
   ``--calibrate-rate 0`` plans from the quiet profile;
3. for each ``--points RATE:TARGET``, plans one CPU device's pool with ``mainspring plan``
   (``--noise shared-cpu``: the worker shares the machine's 2 cores with the controller and the
   client) over a long simulated window;
4. serves the planned pool, and the largest pool the plan found to miss (its margin), each with
   ``mainspring serve --pool-mib`` and one CPU worker, and drives each with ``mainspring bench``'s
   open loop (a fresh server per run, every model cold at the start, as in the simulation);
5. prints the predicted and the measured attainment side by side, per run.

    .venv/bin/python benchmarks/plan_live.py [--points 40:95 50:91] [--calibrate-rate 40]
        [--plan-s 600] [--live-s 120] [--seeds 1 2] [--json out/plan_live/results.json]

Live runs share 2 cores with their client, so expect each figure to move by a point or more between
runs (four at the margin's pool, where queues build); the plan's window is long so that its own
figures do not.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import statistics
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from tests.serving.processes import ServerProcess  # noqa: E402

from mainspring.models.repository import ModelRepository  # noqa: E402
from mainspring.protocol.pages import DEFAULT_PAGE_BYTES, MIB  # noqa: E402
from mainspring.telemetry.analyze import read_run, runs  # noqa: E402
from mainspring.telemetry.profile_recalibration import served_durations  # noqa: E402
from scenarios import build_repo  # noqa: E402

OUT = ROOT / "out" / "plan_live"
MODELS = 30
SLO_MS = 100.0
MODEL_BYTES = 3 * DEFAULT_PAGE_BYTES  # resnet18 at 64x64: 44.6 MiB of weights in three pages


def mainspring(*args: str) -> list[str]:
    return [sys.executable, "-m", "mainspring.cli", *args]


def profiled_repo() -> Path:
    repo = build_repo("resnet18-64x30")
    if not ModelRepository(repo).all_profiles():
        subprocess.run(mainspring("profile", str(repo), "--model", "resnet18-00", "--quiet"), check=True)
    return repo


def calibrated_repo(repo: Path, rate: float, seconds: float) -> Path:
    """A copy of ``repo`` whose profile is recalibrated to a served run at ``rate``, every model resident."""
    copy = OUT / "repo-calibrated"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(repo, copy)
    every_model = MODELS * MODEL_BYTES // MIB
    live = serve_and_bench(copy, every_model, rate, seconds, 1, f"calibration-{rate:g}rps")
    print(f"calibration at {rate:g} r/s, every model resident: {live['slo_attainment']:.2%}", flush=True)
    subprocess.run(mainspring("profile", str(copy), "--from-log", str(live["logs"])), check=True)
    return copy


def make_plan(repo: Path, rate: float, target: float, args: argparse.Namespace) -> dict[str, Any]:
    path = OUT / f"plan-{rate:g}rps-{target:g}.json"
    command = mainspring(
        "plan", "--profiles", str(repo), "--models", str(MODELS), "--workload", "poisson", "--popularity", "zipf",
        "--rate", str(rate), "--slo-ms", str(SLO_MS), "--duration-s", str(args.plan_s), "--max-devices", "1",
        "--device-memory-gib", str(args.pool_gib), "--noise", "shared-cpu", "--attainment", str(target),
        "--json", str(path), "--plot", str(path.with_suffix(".png")),
    )  # fmt: skip
    planned = subprocess.run(command, check=False)
    if planned.returncode not in (0, 1):  # 1: no plan, the JSON says what was reached
        raise SystemExit(f"mainspring plan failed with status {planned.returncode}")
    return dict(json.loads(path.read_text()))


def serve_and_bench(repo: Path, pool_mib: int, rate: float, seconds: float, seed: int, name: str) -> dict[str, Any]:
    report = OUT / f"{name}.json"
    logs = OUT / "logs" / name
    shutil.rmtree(logs, ignore_errors=True)
    server = ServerProcess(repo, OUT / f"{name}.server.log", "--pool-mib", str(pool_mib), "--log-dir", str(logs))
    try:
        server.wait_ready()
        command = mainspring(
            "bench", "--url", server.http, "--workload", "poisson", "--popularity", "zipf", "--rate", str(rate),
            "--duration-s", str(seconds), "--slo-ms", str(SLO_MS), "--seed", str(seed), "--json", str(report),
            "--quiet",
        )  # fmt: skip
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    finally:
        server.stop()
    return dict(json.loads(report.read_text())) | {"batch_ms": live_batch_ms(logs), "logs": logs}


def live_batch_ms(logs: Path) -> dict[int, float]:
    """The worker's median duration of each batch size it ran, over every model, from the server's
    action log: what the profile's quiet-process times became with the controller and the client on
    the same cores."""
    by_size: dict[int, list[int]] = collections.defaultdict(list)
    for run in runs(logs):
        for served in served_durations(read_run(logs, run)[1].values()).values():
            for size, took in served.infers.items():
                by_size[size] += took
    return {size: round(statistics.median(took) / 1e6, 1) for size, took in sorted(by_size.items())}


def check_point(repo: Path, rate: float, target: float, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Plan for ``target`` at ``rate``, serve the planned pool and the margin's, and print both."""
    plan = make_plan(repo, rate, target, args)
    if plan["pool_bytes"] is None:
        print(f"no plan: no pool up to {args.pool_gib:g} GiB reaches {target:g}% at {rate:g} r/s", flush=True)
        return []
    planned = plan["pool_bytes"]
    below = max((p for p in plan["points"] if p["pool_bytes"] < planned), key=lambda p: p["pool_bytes"], default=None)
    pools = [planned] + ([below["pool_bytes"]] if below is not None else [])
    predicted = {p["pool_bytes"]: p["attainment"] for p in plan["points"] if p["devices"] == 1}
    rows = []
    for pool in pools:
        for seed in args.seeds:
            name = f"{rate:g}rps-pool{pool // MIB}-seed{seed}"
            live = serve_and_bench(repo, pool // MIB, rate, args.live_s, seed, name)
            rows.append({"rate": rate, "target": target, "pool_mib": pool // MIB, "seed": seed,
                         "predicted": predicted[pool], "measured": live["slo_attainment"],
                         "requests": live["requests"], "goodput_rps": live["goodput_rps"],
                         "p99_ms": live["latency_ms"]["p99"], "live_batch_ms": live["batch_ms"]})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    print(f"\ntarget {target:g}% at {rate:g} r/s; plan: a {planned // MIB} MiB pool")
    print("| pool MiB | models held | predicted | measured (seeds) |\n|---|---|---|---|")
    for pool in pools:
        measured = ", ".join(f"{r['measured']:.2%}" for r in rows if r["pool_mib"] == pool // MIB)
        print(f"| {pool // MIB} | {pool // MODEL_BYTES} | {predicted[pool]:.2%} | {measured} |", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", nargs="+", default=["40:95", "50:91"], help="RATE:TARGET pairs (r/s:percent)")
    parser.add_argument("--calibrate-rate", type=float, default=40.0, help="0: plan from the quiet profile")
    parser.add_argument("--calibrate-s", type=float, default=60.0)
    parser.add_argument("--plan-s", type=float, default=600.0, help="the plan's simulated window")
    parser.add_argument("--pool-gib", type=float, default=2.0, help="the largest pool the plan tries")
    parser.add_argument("--live-s", type=float, default=120.0, help="each live run's arrivals")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", type=Path, default=OUT / "results.json")
    args = parser.parse_args()
    points = [tuple(float(v) for v in point.split(":")) for point in args.points]
    OUT.mkdir(parents=True, exist_ok=True)
    repo = profiled_repo()
    quiet = ModelRepository(repo).all_profiles()[0]
    if args.calibrate_rate > 0:
        repo = calibrated_repo(repo, args.calibrate_rate, args.calibrate_s)
    profile = ModelRepository(repo).all_profiles()[0]
    print(f"batch ms, profiled: {as_ms(quiet.exec_ns)}; planned from: {as_ms(profile.exec_ns)}", flush=True)
    rows = []
    for rate, target in points:
        rows += check_point(repo, rate, target, args)
        args.json.write_text(json.dumps({"profile_ms": as_ms(profile.exec_ns), "runs": rows}, indent=2) + "\n")


def as_ms(exec_ns: Mapping[int, int]) -> dict[int, float]:
    return {size: round(ns / 1e6, 1) for size, ns in sorted(exec_ns.items())}


if __name__ == "__main__":
    main()
