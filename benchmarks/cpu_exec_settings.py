"""What each CPU execution setting buys: p50, p99 and p99/p50 of exec time, variants side by side.

Variants of ``ExecSettings`` run the same models through the real worker path, in
interleaved chunks (round-robin, so slow drift of the machine hits all alike):
the default (1 intra-op thread, inference mode), torch's default thread count, the exec
thread pinned to a core, and ``no_grad`` instead of inference mode. Warm-up is measured
separately: the first run of each batch size on a freshly loaded module against the
steady state that follows.

    .venv/bin/python benchmarks/cpu_exec_settings.py [--rounds 10] [--chunk 20] [--image-size 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mainspring.models.loading import export_zoo_model, load_module
from mainspring.models.profiler import ActionRunner, sample_inputs
from mainspring.models.repository import ModelRepository
from mainspring.models.zoo import example_inputs
from mainspring.protocol import Infer, LoadWeights
from mainspring.protocol.pages import MIB
from mainspring.worker.runtimes.torch_device import ExecSettings
from mainspring.worker.torch_worker import TorchWorker

CASES = (("resnet18", 1), ("resnet18", 8), ("bert_tiny", 1), ("bert_tiny", 8))


def variants() -> dict[str, ExecSettings]:
    default = ExecSettings()
    return {
        "default (1 thread, inference_mode)": default,
        f"torch's threads ({os.cpu_count()})": dataclasses.replace(default, intra_op_threads=os.cpu_count()),
        "exec thread pinned": dataclasses.replace(default, pin_core=0),
        "no_grad, not inference_mode": dataclasses.replace(default, inference_mode=False),
    }


def first_runs(repo: ModelRepository, model: str) -> list[tuple[int, float, float]]:
    """Per batch size: the first forward of a freshly loaded module, and the median of the next 20 (ms)."""
    torch.set_num_threads(1)
    config, module = load_module(repo, model)
    rows = []
    for batch in config.batch_sizes:
        inputs = example_inputs(config.inputs, batch)
        times = []
        for _ in range(21):
            begin = time.perf_counter_ns()
            with torch.inference_mode():
                module(*inputs)
            times.append((time.perf_counter_ns() - begin) / 1e6)
        rows.append((batch, times[0], float(np.median(times[1:]))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--chunk", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = ModelRepository(Path(folder))
        export_zoo_model(repo, "resnet18", args={"image_size": args.image_size})
        export_zoo_model(repo, "bert_tiny")
        runner = ActionRunner()
        workers = {
            name: TorchWorker(repo, runner.results.put, settings=s, pool_bytes=256 * MIB)
            for name, s in variants().items()
        }
        for worker in workers.values():
            for model in ("resnet18", "bert_tiny"):
                runner.run(worker.submit, LoadWeights, model)
        samples = {(m, b): sample_inputs(workers[next(iter(workers))].configs()[m], b) for m, b in CASES}
        durations: dict[tuple[str, str, int], list[int]] = {}
        for _ in range(args.rounds):
            for name, worker in workers.items():
                torch.set_num_threads(worker.settings.intra_op_threads or os.cpu_count() or 1)
                for model, batch in CASES:
                    for _ in range(args.chunk):
                        result = runner.run(worker.submit, Infer, model, batch, samples[model, batch])
                        assert result.timing is not None
                        durations.setdefault((name, model, batch), []).append(result.timing.duration_ns)
        for worker in workers.values():
            worker.close()
        print(f"exec time by setting, ms ({args.rounds} rounds x {args.chunk} runs, interleaved)")
        print(f"{'setting':<36} {'model':<10} {'batch':>5} {'p50':>8} {'p99':>8} {'p99/p50':>8}")
        for (name, model, batch), values in durations.items():
            p50, p99 = np.percentile(np.array(values) / 1e6, [50, 99])
            print(f"{name:<36} {model:<10} {batch:>5} {p50:>8.3f} {p99:>8.3f} {p99 / p50:>8.3f}")
        print("\nwarm-up: first forward of a fresh module against the median of the next 20, ms")
        for model in ("resnet18", "bert_tiny"):
            for batch, first, steady in first_runs(repo, model):
                print(
                    f"{model:<10} batch {batch}: first {first:8.3f}  steady {steady:8.3f}  ratio {first / steady:6.2f}"
                )


if __name__ == "__main__":
    main()
