"""What a reload in place costs the requests around it, live: one CPU worker serving resnet18 (the
zoo's, 64x64) under Poisson load, with version 2 copied in and loaded part-way through.

Each round starts a fresh ``mainspring serve`` on the repository, runs ``mainspring bench`` for
``--duration-s`` and, in the rounds with a reload, copies version 2 (the same files) in at
``--reload-at-s`` and asks for the load through the repository API (Triton's load of a loaded
model). Rounds with and without a reload alternate, so the machine's drift hits both alike.
Prints each round's attainment, timed-out requests, latency p99 and max, and how long the load
took. Run it for two checkouts to compare a change (the server runs the code on ``PYTHONPATH``):

    .venv/bin/python benchmarks/reload_stall.py [--rounds 3] [--rate 40] [--duration-s 20]
    PYTHONPATH=<another checkout>/src .venv/bin/python benchmarks/reload_stall.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.serving.processes import ServerProcess  # noqa: E402

BIN = Path(sys.executable).parent


def reload_later(url: str, repo: Path, at_s: float, took: list[float]) -> None:
    time.sleep(at_s)
    shutil.copytree(repo / "resnet18" / "1", repo / "resnet18" / "2")
    begin = time.monotonic()
    httpclient.InferenceServerClient(url, network_timeout=120.0).load_model("resnet18")
    took.append(time.monotonic() - begin)


def one_round(repo: Path, scratch: Path, args: argparse.Namespace, reload: bool, name: str) -> str:
    shutil.rmtree(repo / "resnet18" / "2", ignore_errors=True)
    server = ServerProcess(repo, scratch / f"{name}-server.log")
    url = server.http
    try:
        server.wait_ready()
        bench = [str(BIN / "mainspring"), "bench", "--url", url, "--models", "resnet18", "--rate", str(args.rate),
                 "--slo-ms", str(args.slo_ms), "--quiet", "--seed", str(args.seed)]  # fmt: skip
        # the first seconds after a start are not what is measured
        subprocess.run([*bench, "--duration-s", "5"], check=True, capture_output=True)
        report = scratch / f"{name}.json"
        took: list[float] = []
        loader = threading.Thread(target=reload_later, args=(url, repo, args.reload_at_s, took)) if reload else None
        if loader is not None:
            loader.start()
        subprocess.run([*bench, "--duration-s", str(args.duration_s), "--json", str(report)], check=True,
                       capture_output=True)  # fmt: skip
        if loader is not None:
            loader.join()
    finally:
        server.stop()
    data = json.loads(report.read_text())
    latency = data["latency_ms"]
    load = f"load {took[0]:.2f} s" if took else "no reload"
    return (
        f"{name:10} {data['slo_attainment']:8.2%} of {data['requests']}  timed out {data['timed_out']:>3}  "
        f"late {data['late']:>3}  rejected {data['rejected']:>3}  p99 {latency['p99']:6.1f} ms  "
        f"max {latency['max']:6.1f} ms  {load}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind (with and without a reload)")
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--slo-ms", type=float, default=100.0)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--reload-at-s", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        repo = scratch / "repo"
        export = [str(BIN / "mainspring"), "zoo", "export", "--out", str(repo), "--models", "resnet18"]
        subprocess.run(export, check=True, capture_output=True)
        print(f"resnet18 64x64 on one CPU worker, Poisson {args.rate:g} r/s, SLO {args.slo_ms:g} ms, "
              f"{args.duration_s:g} s; reload at {args.reload_at_s:g} s", flush=True)  # fmt: skip
        for index in range(args.rounds):
            for reload in (True, False):
                name = f"{'reload' if reload else 'steady'}-{index + 1}"
                print(one_round(repo, scratch, args, reload, name), flush=True)


if __name__ == "__main__":
    main()
