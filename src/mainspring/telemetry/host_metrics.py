"""Triton's CPU and GPU gauges (its metrics guide's names, units and ``gpu_uuid`` label): the controller's host
from ``/proc``, read when ``/metrics`` is, and the GPUs' memory as their workers last reported it (with their
heartbeats). Absent where there is nothing to read: no ``/proc`` (not Linux), no GPU."""

from __future__ import annotations

from pathlib import Path

from mainspring.protocol.devices import GpuMemory

PROC = Path("/proc")


class HostMetrics:
    def __init__(self, proc: Path = PROC) -> None:
        self._proc = proc
        self._cpu_before: tuple[int, int] | None = None  # (busy, idle) jiffies at the last read
        self.gpus: tuple[GpuMemory, ...] = ()  # the connected workers' GPUs, set before each exposition

    def exposition(self) -> str:
        lines: list[str] = []
        utilization, memory = self._cpu_utilization(), self._memory()
        if utilization is not None:
            _gauge(lines, "nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0] since the last read", utilization)
        if memory is not None:
            total, used = memory
            _gauge(lines, "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", total)
            _gauge(lines, "nv_cpu_memory_used_bytes", "CPU used memory (RAM: total less available), in bytes", used)
        gpus = {gpu.uuid: gpu for gpu in self.gpus}  # two workers on one GPU: one series
        if gpus:
            lines += ["# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes",
                      "# TYPE nv_gpu_memory_total_bytes gauge"]  # fmt: skip
            lines += [f'nv_gpu_memory_total_bytes{{gpu_uuid="{u}"}} {g.total_bytes}' for u, g in sorted(gpus.items())]
            lines += ["# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes",
                      "# TYPE nv_gpu_memory_used_bytes gauge"]  # fmt: skip
            lines += [f'nv_gpu_memory_used_bytes{{gpu_uuid="{u}"}} {g.used_bytes}' for u, g in sorted(gpus.items())]
        return "".join(line + "\n" for line in lines)

    def _cpu_utilization(self) -> float | None:
        """Busy share of every core's time since the last read (since boot at the first), as Triton's."""
        try:
            fields = [int(f) for f in (self._proc / "stat").read_text().split("\n", 1)[0].split()[1:9]]
        except (OSError, ValueError):
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = fields + [0] * (8 - len(fields))
        now = (user + nice + system + irq + softirq + steal, idle + iowait)
        before, self._cpu_before = self._cpu_before or (0, 0), now
        busy, total = now[0] - before[0], now[0] + now[1] - before[0] - before[1]
        return busy / total if total > 0 else 0.0

    def _memory(self) -> tuple[int, int] | None:
        """(total, used) bytes: used is total less what ``MemAvailable`` says new work could take."""
        try:
            lines = (self._proc / "meminfo").read_text().splitlines()
        except OSError:
            return None
        kib = {line.split(":")[0]: line.split()[1] for line in lines if ":" in line and len(line.split()) > 1}
        if "MemTotal" not in kib or "MemAvailable" not in kib:
            return None
        total, available = int(kib["MemTotal"]) * 1024, int(kib["MemAvailable"]) * 1024
        return total, total - available


def _gauge(lines: list[str], name: str, text: str, value: float) -> None:
    lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {value!r}"]
