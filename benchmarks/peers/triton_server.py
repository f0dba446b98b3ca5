"""Triton Inference Server as pip users run it (PyTriton 0.7.0, which ships ``tritonserver``), on the
models of a Mainspring repository. Run in its own environment (``benchmarks/peers/install.sh``):

    .peers/triton/bin/python benchmarks/peers/triton_server.py --repo DIR [--http-port 8000] [--grpc-port 8001]
        [--resident N] [--loading docs|expert]

Settings, each as a user tuning Triton for a latency SLO would choose it:

- ``max_batch_size`` = the model's largest batch size (8 for the zoo), the sizes Mainspring serves;
- dynamic batching with ``max_queue_delay_microseconds`` = 1,000 (wait at most 1 ms for a batch
  to fill; at a 100 ms SLO a longer delay buys nothing on a CPU, where time grows with batch);
- a queue policy that REJECTs a request whose ``timeout`` (the client's SLO, sent as the KServe
  ``timeout`` parameter, ``allow_timeout_override``) passes while it waits: Triton's own way
  to shed load that can no longer make it (with a 60 s default timeout, which the clients'
  timeouts lower: a request can only lower the default);
- one execution at a time in ``expert`` mode (a process-wide lock, held over the load too, which
  copies into an evicted module that another thread could be running): PyTriton runs each model's
  callable in its own thread, and two torch threads in one process slow each other (GIL); one
  device runs one batch at a time, as Mainspring's worker does; ``docs`` mode leaves PyTriton's
  threads as they are (its loads build new modules);
- ``torch.set_num_threads(1)``, like Mainspring's CPU worker (one core per device);
- ``--resident N``: at most N models in memory, least recently used evicted (see ``residency.py``
  for the two loading modes); default: every model resident from the start.
"""

from __future__ import annotations

import argparse
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from pytriton.triton import Triton, TritonConfig
from residency import LOADINGS, Residency, run_batch

from mainspring.models.repository import ModelRepository
from mainspring.protocol.tensors import numpy_dtype

QUEUE_DELAY_US = 1_000
# A request may only lower the model's default timeout, and a default of 0 means "none", which no
# request can lower: without a default, the clients' timeouts are ignored (measured: 0 rejections
# and a 23 s p99 at 95% load).
DEFAULT_TIMEOUT_US = 60_000_000


def infer_function(residency: Residency, model: str, input_names: list[str], output_names: list[str],
                   lock: threading.Lock | None) -> Any:  # fmt: skip
    @batch  # type: ignore[untyped-decorator]
    def infer(**inputs: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
        tensors = [torch.from_numpy(inputs[name]) for name in input_names]
        if lock is None:
            outputs = run_batch(residency.get(model), tensors)
        else:  # the load too: an expert load overwrites an evicted module that another thread may be running
            with lock:
                outputs = run_batch(residency.get(model), tensors)
        return {name: out.numpy() for name, out in zip(output_names, outputs, strict=True)}

    return infer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--resident", type=int, help="most models in memory at once (default: all)")
    parser.add_argument("--loading", choices=LOADINGS, default="expert")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    repo = ModelRepository(args.repo)
    models = repo.models()
    residency = Residency(repo, models, args.resident, args.loading)
    lock = threading.Lock() if args.loading == "expert" else None
    config = TritonConfig(http_address="127.0.0.1", http_port=args.http_port, grpc_address="127.0.0.1",
                          grpc_port=args.grpc_port, metrics_port=args.metrics_port)  # fmt: skip
    with Triton(config=config) as triton:
        for model in models:
            spec = repo.config(model)
            policy = QueuePolicy(
                timeout_action=TimeoutAction.REJECT,
                default_timeout_microseconds=DEFAULT_TIMEOUT_US,
                allow_timeout_override=True,
            )
            triton.bind(
                model_name=model,
                infer_func=infer_function(
                    residency, model, [t.name for t in spec.inputs], [t.name for t in spec.outputs], lock
                ),
                inputs=[Tensor(name=t.name, dtype=numpy_dtype(t.datatype), shape=t.shape[1:]) for t in spec.inputs],
                outputs=[Tensor(name=t.name, dtype=numpy_dtype(t.datatype), shape=t.shape[1:]) for t in spec.outputs],
                config=ModelConfig(
                    max_batch_size=spec.max_batch,
                    batcher=DynamicBatcher(max_queue_delay_microseconds=QUEUE_DELAY_US, default_queue_policy=policy),
                ),
                strict=False,
            )
        print(f"triton peer ready: {len(models)} models, resident {residency.capacity}, loading {args.loading}",
              flush=True)  # fmt: skip
        triton.serve()


if __name__ == "__main__":
    main()
