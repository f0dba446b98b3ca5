"""CUDA graphs of loaded models, and the CUDA errors no process recovers from.

A graph bakes in the addresses of the page views it was captured on, so each load of a model is
captured anew (``TorchDevice`` does it after the load's result, while its load lane is idle).
Every capture runs on a stream of its own, and every graph of a device draws from one shared
memory pool: the exec lane replays one graph at a time on one stream, so graphs may share scratch
memory, and the pool is not one per (model, batch size) outside the page pool. Captures run on
one stream of the device's own, made once: ``torch.cuda.Stream()`` hands out the streams of a
pool of 32 in turn, so one made per capture would in time be the exec stream. A batch size that
fails to capture is remembered and not tried again until its model is registered anew: before
pytorch#180395 a failed capture left the allocator believing a capture was still under way (every
later one failed too), and later versions still leak its private pool (pytorch#190348).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

# What a CUDA error that leaves the context unusable says (every later call fails the same way).
STICKY_CUDA_ERRORS = (
    "device-side assert triggered",
    "an illegal memory access was encountered",
    "unspecified launch failure",
    "misaligned address",
    "an illegal instruction was encountered",
    "uncorrectable ecc error",
)


def is_sticky_cuda_error(error: BaseException) -> bool:
    """Whether ``error`` left its CUDA context poisoned (only a new process recovers)."""
    text = str(error).lower()
    return "cuda" in text and any(sign in text for sign in STICKY_CUDA_ERRORS)


Graph = tuple[Any, tuple[torch.Tensor, ...]]  # a captured graph and its output tensors


class GraphCapture:
    """Captures graphs for one device into its shared pool, remembering what cannot be captured."""

    def __init__(self, device: torch.device, stream: Any, new_graph: Callable[[], Any] | None = None) -> None:
        self.device = device
        self.failed: dict[tuple[str, int], str] = {}  # (model, batch) -> why its capture failed
        self._stream = stream  # the device's capture stream (None off CUDA)
        self._new_graph = new_graph or torch.cuda.CUDAGraph
        self._pool: Any = None
        self._lock = threading.Lock()  # captures run on the load lane; ``forget`` on the registering thread

    def wanted(self, model: str, batch: int) -> bool:
        with self._lock:
            return (model, batch) not in self.failed

    def forget(self, model: str) -> None:
        """``model`` is registered anew: its batch sizes may be captured again."""
        with self._lock:
            self.failed = {key: why for key, why in self.failed.items() if key[0] != model}

    def capture(
        self,
        model: str,
        batch: int,
        module: nn.Module,
        zeros: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor],
        as_outputs: Callable[[object], tuple[torch.Tensor, ...]],
        current: Callable[[], bool] = lambda: True,
    ) -> Graph | None:
        """``module`` on ``inputs`` as a graph (after a run on ``zeros``, which initialises lazily); None where it
        cannot be captured (logged once; not ``wanted`` again, unless ``current()`` says the load it was for is
        gone meanwhile: a failure then may be the unload's). A sticky CUDA error is raised."""
        try:
            graph = self._new_graph()
            stream = self._stream
            if stream is None:
                raise RuntimeError(f"{self.device} has no capture stream (CUDA graphs need a CUDA device)")
            # The zeros were written on the calling thread's current stream: wait for them.
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.inference_mode(), torch.cuda.stream(stream):
                as_outputs(module(*zeros))
                # thread_local: the exec lane keeps running kernels (this model's too, eagerly) during the capture
                with torch.cuda.graph(graph, pool=self._memory(), stream=stream, capture_error_mode="thread_local"):
                    outputs = as_outputs(module(*inputs))
        except Exception as error:  # whatever the model raises while captured (an export guard: AssertionError)
            if is_sticky_cuda_error(error):
                raise
            reason = (str(error).strip().splitlines() or [repr(error)])[0]
            if not current():
                return None
            with self._lock:
                self.failed[model, batch] = reason
            log.warning("model %s batch %d runs eagerly: its CUDA graph capture failed (%s); not tried again until "
                        "it is registered anew", model, batch, reason)  # fmt: skip
            return None
        return graph, outputs

    def _memory(self) -> Any:
        """The device's one graph memory pool (its token), shared by every capture."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool
