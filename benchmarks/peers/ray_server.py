"""Ray Serve 2.60 on the models of a Mainspring repository, answering the KServe v2 HTTP routes that
``mainspring bench`` uses (metadata, readiness, infer with binary tensors). Run in its own
environment (``benchmarks/peers/install.sh``):

    .peers/ray/bin/python benchmarks/peers/ray_server.py --repo DIR [--http-port 8000]
        [--resident N] [--loading docs|expert]

One replica with one CPU (Mainspring's one CPU worker), settings as a user would choose them for a
100 ms SLO:

- ``@serve.batch(max_batch_size=8, batch_wait_timeout_s=0.001)``: batches of up to the model's
  largest size, waiting at most 1 ms (on a CPU time grows with batch); a batch may mix models,
  so it is split by model and each part runs as one forward pass;
- ``max_ongoing_requests=16`` (two full batches in the replica) and ``max_queued_requests=32``
  (about one SLO of work at capacity): beyond that Ray Serve sheds with 503;
- ``docs`` loading: ``@serve.multiplexed(max_num_models_per_replica=N)`` with a loader that reads
  the model file, and the forward pass run inside the async batch handler, as the documentation
  shows; ``expert`` loading: weights cached in host memory and copied into the evicted module
  (``residency.py``), the forward pass and loads run in a thread so the replica's event loop keeps
  taking requests, and a request whose ``timeout`` (the client's SLO) has passed before its batch
  runs is answered 504 at once instead of being computed;
- ``torch.set_num_threads(1)``, like Mainspring's CPU worker.
"""

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from fastapi import FastAPI, Request, Response
from ray import serve
from residency import LOADINGS, Residency, run_batch

from mainspring.models.loading import load_module
from mainspring.models.repository import ModelRepository
from mainspring.protocol.tensors import numpy_dtype

HEADER_LENGTH = "inference-header-content-length"
app = FastAPI()


EXPIRED = "expired"


def parse_infer(body: bytes, header_length: str | None) -> tuple[dict[str, Any], list[np.ndarray[Any, Any]]]:
    """A KServe v2 infer body with binary tensors: its JSON header and the input arrays in order."""
    split = int(header_length) if header_length else len(body)
    header = json.loads(body[:split])
    arrays, offset = [], split
    for spec in header["inputs"]:
        dtype = numpy_dtype(spec["datatype"])
        size = spec.get("parameters", {}).get("binary_data_size")
        if size is None:
            arrays.append(np.asarray(spec["data"], dtype=dtype).reshape(spec["shape"]))
            continue
        arrays.append(np.frombuffer(body[offset : offset + size], dtype=dtype).reshape(spec["shape"]))
        offset += size
    return header, arrays


def binary_response(model: str, names: list[str], outputs: list[np.ndarray[Any, Any]]) -> Response:
    from mainspring.protocol.tensors import datatype_of

    described = [
        {
            "name": n,
            "datatype": datatype_of(o.dtype),
            "shape": list(o.shape),
            "parameters": {"binary_data_size": o.nbytes},
        }
        for n, o in zip(names, outputs, strict=True)
    ]
    header = json.dumps({"model_name": model, "outputs": described}).encode()
    return Response(header + b"".join(o.tobytes() for o in outputs), media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(len(header))})  # fmt: skip


def deployment(capacity: int) -> Any:
    """The deployment class; made here because ``@serve.multiplexed`` takes its size when a class is defined."""

    @serve.deployment(max_ongoing_requests=16, max_queued_requests=32, ray_actor_options={"num_cpus": 1})
    @serve.ingress(app)
    class KServeModels:
        def __init__(self, repo: str, resident: int | None, loading: str) -> None:
            torch.set_num_threads(1)
            self.repo = ModelRepository(repo)
            self.loading = loading
            self.configs = {m: self.repo.config(m) for m in self.repo.models()}
            models = list(self.configs)
            # docs mode: the multiplexed loader owns residency (the first requests load and warm models).
            self.residency = Residency(self.repo, models, resident, loading) if loading == "expert" else None

        @serve.multiplexed(max_num_models_per_replica=capacity)
        async def get_model(self, model: str) -> Any:
            return load_module(self.repo, model)[1]

        @app.get("/v2/health/ready")
        async def ready(self) -> dict[str, bool]:
            return {"ready": True}

        @app.get("/v2/models/{model}")
        async def metadata(self, model: str) -> Any:
            config = self.configs.get(model)
            if config is None:
                return Response(json.dumps({"error": f"unknown model {model}"}), status_code=404)
            tensors = lambda specs: [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in specs]  # noqa: E731
            return {"name": model, "versions": ["1"], "platform": "pytorch",
                    "inputs": tensors(config.inputs), "outputs": tensors(config.outputs)}  # fmt: skip

        @app.post("/v2/models/{model}/infer")
        async def infer(self, model: str, request: Request) -> Response:
            arrived = time.monotonic()
            config = self.configs.get(model)
            if config is None:
                return Response(json.dumps({"error": f"unknown model {model}"}), status_code=404)
            header, arrays = parse_infer(await request.body(), request.headers.get(HEADER_LENGTH))
            timeout_us = header.get("parameters", {}).get("timeout")
            deadline = arrived + timeout_us / 1e6 if timeout_us else float("inf")
            outputs = await self.run((model, arrays, deadline))
            if outputs == EXPIRED:
                return Response(json.dumps({"error": "timeout expired before the batch ran"}), status_code=504)
            return binary_response(model, [t.name for t in config.outputs], outputs)

        @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.001)  # type: ignore[untyped-decorator]
        async def run(self, items: list[tuple[str, list[np.ndarray[Any, Any]], float]]) -> list[Any]:
            results: list[Any] = [None] * len(items)
            by_model: dict[str, list[int]] = {}
            for index, (model, _, _) in enumerate(items):
                by_model.setdefault(model, []).append(index)
            for model, indices in by_model.items():
                if self.residency is not None:
                    now = time.monotonic()
                    for i in [i for i in indices if items[i][2] <= now]:
                        results[i] = EXPIRED
                    indices = [i for i in indices if items[i][2] > now]
                    if not indices:
                        continue
                    module = await asyncio.to_thread(self.residency.get, model)
                else:
                    module = await self.get_model(model)
                inputs = [torch.from_numpy(np.concatenate([items[i][1][k] for i in indices]))
                          for k in range(len(items[indices[0]][1]))]  # fmt: skip
                if self.residency is not None:
                    outputs = await asyncio.to_thread(run_batch, module, inputs)
                else:
                    outputs = run_batch(module, inputs)
                offset = 0
                for i in indices:
                    size = items[i][1][0].shape[0]
                    results[i] = [o[offset : offset + size].numpy() for o in outputs]
                    offset += size
            return results

    return KServeModels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--resident", type=int, help="most models in memory at once (default: all)")
    parser.add_argument("--loading", choices=LOADINGS, default="expert")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parent)}})  # fmt: skip
    serve.start(http_options={"host": "127.0.0.1", "port": args.http_port})
    capacity = args.resident or len(ModelRepository(args.repo).models())
    models = deployment(capacity)
    serve.run(models.bind(str(args.repo.resolve()), args.resident, args.loading), route_prefix="/")
    print(f"ray peer ready: loading {args.loading}, resident {args.resident or 'all'}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


if __name__ == "__main__":
    main()
