"""Latency the frontend and controller add over bare model execution, side by side in one run.

Starts ``mainspring serve`` (one CPU worker process) on a repository of zoo models and,
in interleaved rounds, measures: the bare runtime (the same model through an in-process
``TorchWorker``: the exec time the worker reports), and end-to-end latency through KServe
v2 HTTP at a low rate (one request at a time) and a high rate (``--concurrency`` clients in
a closed loop). Added latency = end-to-end minus bare, at p50 and p99.

    .venv/bin/python benchmarks/serving_overhead.py [--rounds 3] [--requests 200] [--models mlp,resnet18]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

from mainspring.models.loading import export_zoo_model
from mainspring.models.profiler import ActionRunner, ProfilerSettings, measure_exec
from mainspring.models.repository import ModelRepository
from mainspring.protocol import LoadWeights
from mainspring.protocol.pages import MIB
from mainspring.worker.torch_worker import TorchWorker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.serving.processes import ServerProcess, http_call


def request_body(repo: ModelRepository, model: str, binary: bool) -> tuple[bytes, dict[str, str]]:
    """A batch-1 request as JSON data, or with the binary tensor extension (as tritonclient sends by default)."""
    config = repo.config(model)
    spec = config.inputs[0]
    shape = [1, *spec.sample_shape]
    array = np.random.default_rng(0).standard_normal(int(np.prod(shape))).astype(np.float32)
    tensor: dict[str, object] = {"name": spec.name, "datatype": spec.datatype, "shape": shape}
    outputs = [{"name": config.outputs[0].name, "parameters": {"binary_data": True}}]
    if not binary:
        return json.dumps({"inputs": [{**tensor, "data": array.tolist()}], "outputs": outputs}).encode(), {}
    tensor["parameters"] = {"binary_data_size": array.nbytes}
    header = json.dumps({"inputs": [tensor], "outputs": outputs}).encode()
    return header + array.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def metric_sums(server: ServerProcess, model: str) -> tuple[float, float, float]:
    """(sum of request latencies, sum of infer durations, requests answered) from the server's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = http_call(f"http://{server.http}/metrics")[1].decode()
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
              for s in f.samples}  # fmt: skip
    latency = values.get(("mainspring_request_latency_seconds_sum", (("model", model),)), 0.0)
    count = values.get(("mainspring_request_latency_seconds_count", (("model", model),)), 0.0)
    execs = values.get(("mainspring_action_duration_seconds_sum", (("kind", "infer"),)), 0.0)
    return latency, execs, count


async def closed_loop(
    url: str, request: tuple[bytes, dict[str, str]], requests: int, concurrency: int
) -> tuple[list[float], float]:
    body, headers = request
    latencies: list[float] = []
    async with aiohttp.ClientSession() as session:

        async def client(count: int) -> None:
            for _ in range(count):
                begin = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{response.status}: {await response.text()}")
                latencies.append((time.perf_counter() - begin) * 1e3)

        begin = time.perf_counter()
        await asyncio.gather(*(client(requests // concurrency) for _ in range(concurrency)))
        return latencies, time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,resnet18")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="requests per phase and round")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--serve-args", default="", help="extra flags for mainspring serve, e.g. --pin-cpu-workers")
    args = parser.parse_args()
    models = args.models.split(",")
    folder = Path(tempfile.mkdtemp())
    repo = ModelRepository(folder)
    for model in models:
        export_zoo_model(repo, model)
    server = ServerProcess(folder, folder / "server.log", "--slo-ms", "10000", *args.serve_args.split())
    try:
        server.wait_ready()
        runner = ActionRunner()
        bare = TorchWorker(repo, runner.results.put, pool_bytes=512 * MIB, models=models)
        for model in models:
            runner.run(bare.submit, LoadWeights, model)
        settings = ProfilerSettings(warmup_runs=5, min_runs=args.requests, max_runs=args.requests,
                                    max_seconds_per_batch=120)  # fmt: skip
        results: dict[tuple[str, str], list[float]] = {}
        rate: dict[str, list[float]] = {}
        split_of: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for model in models:
                url = f"http://{server.http}/v2/models/{model}/infer"
                body = request_body(repo, model, binary=False)
                binary = request_body(repo, model, binary=True)
                durations = measure_exec(runner, bare.submit, bare.configs()[model], 1, settings).durations_ns
                results.setdefault((model, "bare exec"), []).extend(d / 1e6 for d in durations)
                before = metric_sums(server, model)
                low, _ = asyncio.run(closed_loop(url, body, args.requests, 1))
                after = metric_sums(server, model)
                results.setdefault((model, "served, 1 at a time"), []).extend(low)
                low_binary, _ = asyncio.run(closed_loop(url, binary, args.requests, 1))
                results.setdefault((model, "binary, 1 at a time"), []).extend(low_binary)
                split = split_of.setdefault(model, [0.0, 0.0, 0.0])
                for i in range(3):
                    split[i] += after[i] - before[i]
                high, seconds = asyncio.run(closed_loop(url, binary, args.requests, args.concurrency))
                results.setdefault((model, f"binary, {args.concurrency} clients"), []).extend(high)
                rate.setdefault(model, []).append(len(high) / seconds)
        bare.close()
        print(
            f"latency in ms, {args.rounds} rounds x {args.requests} requests, batch 1, CPU worker, KServe v2 HTTP "
            "(JSON or binary tensors)"
        )
        print(f"{'model':<10} {'phase':<22} {'p50':>8} {'p99':>8} {'added p50':>10} {'added p99':>10}")
        for model in models:
            base50, base99 = np.percentile(results[model, "bare exec"], [50, 99])
            for (name, phase), values in results.items():
                if name != model:
                    continue
                p50, p99 = np.percentile(values, [50, 99])
                added = "" if phase == "bare exec" else f"{p50 - base50:>+10.3f} {p99 - base99:>+10.3f}"
                print(f"{model:<10} {phase:<22} {p50:>8.3f} {p99:>8.3f} {added}")
            latency, execs, count = split_of[model]
            e2e = float(np.mean(results[model, "served, 1 at a time"]))
            print(
                f"{model:<10} 1 at a time, means: end to end {e2e:.3f}, in the server {latency / count * 1e3:.3f}, "
                f"exec in the worker {execs / count * 1e3:.3f} -> controller+transport "
                f"{(latency - execs) / count * 1e3:.3f}, frontend+client {e2e - latency / count * 1e3:.3f}"
            )
            print(f"{model:<10} throughput with {args.concurrency} clients: {np.mean(rate[model]):.0f} r/s")
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
