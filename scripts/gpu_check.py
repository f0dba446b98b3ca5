"""The second half of ``make gpu-check`` (the first is the ``gpu``-marked tests): profile the built-in zoo
on a GPU, serve it there under load for a short while, and print what Clockwork's Fig. 10 needs: the
prediction error of each kind of action, and each model's exec p99/p50 at each batch size.

    python scripts/gpu_check.py [--device cuda:0] [--seconds 20] [--rate 400]

Exits non-zero when a step fails or an action fails. Runs in about two minutes on one GPU."""

from __future__ import annotations

import argparse
import csv
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

MAINSPRING = [sys.executable, "-m", "mainspring.cli"]
MODELS = "resnet18,mobilenetv2,bert_tiny,mlp"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def step(title: str, command: list[str], timeout_s: float) -> None:
    print(f"\n== {title}: {' '.join(command[2:])}", flush=True)
    subprocess.run(command, check=True, timeout=timeout_s)


def wait_ready(port: int, server: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server was not ready within {timeout_s:.0f} s")


def action_figures(logs: Path) -> int:
    """Print the prediction error per action kind and exec p99/p50 per (model, batch); the failures' count."""
    rows = []
    for path in sorted(logs.glob("*-actions.tsv")):
        with path.open() as handle:
            rows += list(csv.DictReader(handle, delimiter="\t"))
    ran = [r for r in rows if int(r["begin_ns"]) >= 0 and r["status"] == "ok"]

    def took_ms(row: dict[str, str]) -> float:
        return (int(row["end_ns"]) - int(row["begin_ns"])) / 1e6

    print(f"\n== actions: {len(rows)} sent, {len(ran)} ran OK, {len(rows) - len(ran)} not")
    print("prediction error (measured - expected), ms:  kind  count  p1  p50  p99")
    for kind in sorted({r["kind"] for r in ran}):
        errors = [took_ms(r) - int(r["expected_ns"]) / 1e6 for r in ran if r["kind"] == kind]
        p1, p50, p99 = np.percentile(errors, [1, 50, 99])
        print(f"  {kind:6s} {len(errors):6d} {p1:8.3f} {p50:8.3f} {p99:8.3f}")
    print("exec time, ms:  model  batch  count  p50  p99  p99/p50")
    infers: dict[tuple[str, int], list[float]] = {}
    for r in ran:
        if r["kind"] == "infer":
            infers.setdefault((r["model"], int(r["batch_size"])), []).append(took_ms(r))
    for (model, batch), durations in sorted(infers.items()):
        p50, p99 = np.percentile(durations, [50, 99])
        print(f"  {model:12s} {batch:3d} {len(durations):6d} {p50:8.3f} {p99:8.3f} {p99 / p50:6.2f}")
    return sum(1 for r in rows if r["status"] == "error")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=400.0)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: gpu-check needs one")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(args.device)}")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        root = Path(folder)
        repo, logs = root / "zoo", root / "logs"
        step("the zoo at 224x224", [*MAINSPRING, "zoo", "export", "--out", str(repo), "--models", MODELS,
                                    "--image-size", "224"], 600)  # fmt: skip
        step("profile on the GPU", [*MAINSPRING, "profile", str(repo), "--device", args.device, "--max-seconds", "1",
                                    "--quiet"], 600)  # fmt: skip
        for path in sorted(repo.glob("*/*/profile.json")):
            for profile in json.loads(path.read_text())["profiles"]:
                model, kind, load = profile["model"], profile["device_kind"], profile["load_ms"]
                print(f"  {model} on {kind}: load {load} ms, exec ms per batch size {profile['exec_ms']}")
        http, grpc, workers = free_port(), free_port(), free_port()
        command = [*MAINSPRING, "serve", "--repo", str(repo), "--devices", args.device, "--http-port", str(http),
                   "--grpc-port", str(grpc), "--worker-port", str(workers), "--log-dir", str(logs)]  # fmt: skip
        print(f"\n== serve on {args.device}", flush=True)
        server = subprocess.Popen(command)
        try:
            wait_ready(http, server)
            step("bench", [*MAINSPRING, "bench", "--url", f"127.0.0.1:{http}", "--models", MODELS, "--workload",
                           "poisson", "--rate", str(args.rate), "--slo-ms", "100", "--duration-s", str(args.seconds)],
                 args.seconds + 300)  # fmt: skip
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(60)
        failed = action_figures(logs)
    print(f"\n{failed} action(s) answered ERROR")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
