"""What a worker tells the controller of its GPUs' memory, for ``/metrics`` (Triton's
``nv_gpu_memory_used_bytes`` and ``nv_gpu_memory_total_bytes``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mainspring.protocol.devices import GpuMemory
from mainspring.time import NS_PER_S, Clock


class GpuMemoryReader:
    """The CUDA devices' memory as Triton reports it (the whole device's, every process's), read at most once a
    second: every heartbeat carries it to the controller's ``/metrics``."""

    def __init__(self, devices: Sequence[torch.device], clock: Clock, every_ns: int = NS_PER_S) -> None:
        self._devices = [d for d in devices if d.type == "cuda"]
        self._clock = clock
        self._every_ns = every_ns
        self._read_at: int | None = None
        self._last: tuple[GpuMemory, ...] = ()

    def read(self) -> tuple[GpuMemory, ...]:
        now = self._clock.now_ns()
        if not self._devices or (self._read_at is not None and now - self._read_at < self._every_ns):
            return self._last
        self._read_at = now
        try:
            self._last = tuple(_memory_of(device) for device in self._devices)
        except RuntimeError:  # a lost context (the worker starts over): no figure rather than a stale one
            self._last = ()
        return self._last


def _memory_of(device: torch.device) -> GpuMemory:
    free, total = torch.cuda.mem_get_info(device)
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return GpuMemory(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}", total - free, total)
