"""What a worker announces about each of its devices."""

from __future__ import annotations

import msgspec

from mainspring.protocol.pages import DEFAULT_PAGE_BYTES, DEFAULT_POOL_BYTES

# The kind a CPU worker announces (GPU kinds are the GPU's name); the clockwork policy estimates it
# at its own percentile (``ClockworkConfig.estimate_percentile_cpu``).
CPU_KIND = "cpu"


class DeviceSpec(msgspec.Struct, frozen=True):
    """One device: its id, kind (matches ``ModelProfile.device_kind``), weight pool, and the models
    whose weights it already holds (a worker that rejoins a restarted controller keeps them)."""

    device: int
    kind: str = "v100"
    pool_bytes: int = DEFAULT_POOL_BYTES
    page_bytes: int = DEFAULT_PAGE_BYTES
    resident: tuple[str, ...] = ()

    @property
    def total_pages(self) -> int:
        return self.pool_bytes // self.page_bytes


class GpuMemory(msgspec.Struct, frozen=True):
    """One GPU's memory as its worker reads it (``cudaMemGetInfo``: the whole device, every process's use)."""

    uuid: str  # as Triton's ``gpu_uuid`` label: ``GPU-`` and the device's UUID
    used_bytes: int
    total_bytes: int
