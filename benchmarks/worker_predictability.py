"""Exec-time predictability of the zoo on this CPU, and load time against memory-copy bandwidth.

For every zoo model and batch size, through the real worker path (actions on a
``TorchWorker``): the profiler's measurement (p99, as stored in a profile), then a
fresh series of runs: p50, p99, p99/p50, the error of the profile's estimate against
the fresh p99, and the share of fresh runs longer than the estimate. For loads:
p50/p99 of ``LoadWeights`` against a flat copy of the same number of bytes measured in
the same run (the machine's memory-copy bandwidth, the physical limit).

    .venv/bin/python benchmarks/worker_predictability.py [--image-size 64] [--runs 200] [--models resnet18,mlp]
    .venv/bin/python benchmarks/worker_predictability.py --repo DIR   # a repository's own models (ONNX too)
    .venv/bin/python benchmarks/worker_predictability.py --models resnet18 --formats torch_export,onnx
        # the same weights as a torch.export program and through ONNX Runtime, side by side in one run
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mainspring.models.loading import export_zoo_model
from mainspring.models.profiler import ActionRunner, ProfilerSettings, measure_exec, measure_load
from mainspring.models.repository import ModelRepository
from mainspring.models.zoo import ARCHITECTURES
from mainspring.protocol import EvictWeights, LoadWeights
from mainspring.worker.torch_worker import TorchWorker


def flat_copy_ns(nbytes: int, runs: int) -> list[int]:
    source, target = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    target.copy_(source)
    times = []
    for _ in range(runs):
        begin = time.perf_counter_ns()
        target.copy_(source)
        times.append(time.perf_counter_ns() - begin)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated (default: the zoo, or every model of --repo)")
    parser.add_argument("--repo", type=Path, help="measure this repository's models instead of the zoo's")
    parser.add_argument("--formats", default="torch_export", help="zoo model formats, comma-separated (e.g. +onnx)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--runs", type=int, default=200, help="fresh runs per batch size")
    parser.add_argument("--load-runs", type=int, default=30)
    args = parser.parse_args()
    settings = ProfilerSettings(max_runs=args.runs, min_runs=args.runs, max_seconds_per_batch=60)
    with tempfile.TemporaryDirectory() as folder:
        if args.repo is not None:
            repo = ModelRepository(args.repo)
            names = args.models.split(",") if args.models else repo.models()
        else:
            repo = ModelRepository(Path(folder))
            formats = args.formats.split(",")
            names = []
            for name in args.models.split(",") if args.models else list(ARCHITECTURES):
                size = {"image_size": args.image_size} if "image_size" in ARCHITECTURES[name].defaults else {}
                for fmt in formats:  # the same seed: the same weights in every format
                    served = name if len(formats) == 1 else f"{name}-{fmt}"
                    export_zoo_model(repo, name, fmt=fmt, args=size, served_as=served)
                    names.append(served)
        runner = ActionRunner()
        worker = TorchWorker(repo, runner.results.put, use_stored_profiles=False)
        print(f"exec on this CPU (1 intra-op thread, image {args.image_size}x{args.image_size}), ms")
        print(
            f"{'model':<22} {'batch':>5} {'profile p99':>11} {'fresh p50':>9} {'fresh p99':>9} {'p99/p50':>7} "
            f"{'est. error':>10} {'runs > est.':>11}"
        )
        loads = []
        for name in names:
            config = worker.configs()[name]
            loads.append(
                (name, worker.profiles()[name].weights_bytes, measure_load(runner, worker.submit, name, args.load_runs))
            )
            runner.run(worker.submit, LoadWeights, name)
            for batch in config.batch_sizes:
                profiled = measure_exec(runner, worker.submit, config, batch, settings)
                fresh = np.array(measure_exec(runner, worker.submit, config, batch, settings).durations_ns) / 1e6
                estimate = profiled.p99_ns / 1e6
                p50, p99 = np.percentile(fresh, [50, 99])
                print(
                    f"{name:<22} {batch:>5} {estimate:>11.3f} {p50:>9.3f} {p99:>9.3f} {p99 / p50:>7.3f} "
                    f"{(estimate - p99) / p99:>+10.1%} {np.mean(fresh > estimate):>11.1%}"
                )
            runner.run(worker.submit, EvictWeights, name)
        worker.close()
        print("\nloads (LoadWeights into pages) against a flat copy of the same bytes, ms")
        print(f"{'model':<22} {'MB':>7} {'load p50':>8} {'load p99':>8} {'copy p50':>8} {'load/copy':>9} {'GB/s':>6}")
        for name, nbytes, durations in loads:
            copy = np.percentile(flat_copy_ns(nbytes, args.load_runs), 50) / 1e6
            p50, p99 = np.percentile(np.array(durations) / 1e6, [50, 99])
            print(
                f"{name:<22} {nbytes / 1e6:>7.1f} {p50:>8.2f} {p99:>8.2f} {copy:>8.2f} {p50 / copy:>9.2f} "
                f"{nbytes / p50 / 1e6:>6.2f}"
            )


if __name__ == "__main__":
    main()
