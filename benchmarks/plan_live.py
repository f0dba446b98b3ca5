"""``mainspring plan`` checked live: the planned pool and the next size down, served and measured.

On this machine's CPU, for the many-models workload (30 copies of resnet18 at 64x64, Poisson with
Zipf popularity, SLO 100 ms):

1. profiles one copy with ``mainspring profile`` (copies share it);
2. plans one CPU device's pool with ``mainspring plan`` (``--noise shared-cpu``: the worker shares
   the machine's 2 cores with the controller and the client) over a long simulated window;
3. serves the planned pool, and the largest pool the plan found to miss (its margin), each with
   ``mainspring serve --pool-mib`` and one CPU worker, and drives each with ``mainspring bench``'s
   open loop (a fresh server per run, every model cold at the start, as in the simulation);
4. prints the predicted and the measured attainment side by side, per run.

    .venv/bin/python benchmarks/plan_live.py [--rate 40] [--attainment 96] [--plan-s 600]
        [--live-s 120] [--seeds 1 2] [--json out/plan_live/results.json]

Live runs share 2 cores with their client, so expect each figure to move by a point between runs;
the plan's window is long so that its own figures do not.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from tests.serving.processes import ServerProcess  # noqa: E402

from mainspring.models.repository import ModelRepository  # noqa: E402
from mainspring.protocol.pages import DEFAULT_PAGE_BYTES, MIB  # noqa: E402
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


def make_plan(repo: Path, args: argparse.Namespace) -> dict[str, Any]:
    path = OUT / f"plan-{args.rate:g}rps-{args.attainment:g}.json"
    command = mainspring(
        "plan", "--profiles", str(repo), "--models", str(MODELS), "--workload", "poisson", "--popularity", "zipf",
        "--rate", str(args.rate), "--slo-ms", str(SLO_MS), "--duration-s", str(args.plan_s), "--max-devices", "1",
        "--device-memory-gib", str(args.pool_gib), "--noise", "shared-cpu", "--attainment", str(args.attainment),
        "--json", str(path), "--plot", str(path.with_suffix(".png")),
    )  # fmt: skip
    subprocess.run(command, check=True)
    return dict(json.loads(path.read_text()))


def serve_and_bench(repo: Path, pool_mib: int, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    name = f"pool{pool_mib}-seed{seed}"
    report = OUT / f"{name}.json"
    server = ServerProcess(repo, OUT / f"{name}.server.log", "--pool-mib", str(pool_mib))
    try:
        server.wait_ready()
        command = mainspring(
            "bench", "--url", server.http, "--workload", "poisson", "--popularity", "zipf", "--rate", str(rate),
            "--duration-s", str(seconds), "--slo-ms", str(SLO_MS), "--seed", str(seed), "--json", str(report),
            "--quiet",
        )  # fmt: skip
        subprocess.run(command, check=True)
    finally:
        server.stop()
    return dict(json.loads(report.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--attainment", type=float, default=96.0, help="the plan's target, percent")
    parser.add_argument("--plan-s", type=float, default=600.0, help="the plan's simulated window")
    parser.add_argument("--pool-gib", type=float, default=2.0, help="the largest pool the plan tries")
    parser.add_argument("--live-s", type=float, default=120.0, help="each live run's arrivals")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", type=Path, default=OUT / "results.json")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    repo = profiled_repo()
    plan = make_plan(repo, args)
    if plan["pool_bytes"] is None:
        raise SystemExit(f"no plan: no pool up to {args.pool_gib:g} GiB reaches {args.attainment:g}%")
    planned = plan["pool_bytes"]
    below = max((p for p in plan["points"] if p["pool_bytes"] < planned), key=lambda p: p["pool_bytes"], default=None)
    pools = [planned] + ([below["pool_bytes"]] if below is not None else [])
    predicted = {p["pool_bytes"]: p["attainment"] for p in plan["points"] if p["devices"] == 1}
    rows = []
    for pool in pools:
        for seed in args.seeds:
            live = serve_and_bench(repo, pool // MIB, args.rate, args.live_s, seed)
            rows.append({"pool_mib": pool // MIB, "seed": seed, "predicted": predicted[pool],
                         "measured": live["slo_attainment"], "requests": live["requests"],
                         "goodput_rps": live["goodput_rps"], "p99_ms": live["latency_ms"]["p99"]})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            args.json.write_text(json.dumps({"plan": plan, "runs": rows}, indent=2) + "\n")
    print(f"\ntarget {args.attainment:g}% at {args.rate:g} r/s; plan: a {planned // MIB} MiB pool")
    print("| pool MiB | models held | predicted | measured (seeds) |\n|---|---|---|---|")
    for pool in pools:
        measured = ", ".join(f"{r['measured']:.2%}" for r in rows if r["pool_mib"] == pool // MIB)
        print(f"| {pool // MIB} | {pool // MODEL_BYTES} | {predicted[pool]:.2%} | {measured} |")


if __name__ == "__main__":
    main()
