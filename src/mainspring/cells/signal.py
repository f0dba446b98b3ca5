"""A cell's load signal, read from its policy's predictions (``routing.CellSignal``)."""

from __future__ import annotations

from collections.abc import Iterable

from mainspring.cells.routing import CellSignal
from mainspring.scheduler.clockwork.policy import ClockworkScheduler


def cell_signal(cell: int, policy: object, devices: int, now_ns: int, models: Iterable[str]) -> CellSignal:
    """Per model of ``models`` the cell holds, the earliest end of a batch of one on a holder (its exec
    lane's booked time, then the batch); ``cold_start_ns``: the earliest a load lane frees. A policy
    that predicts nothing (the reactive baselines) publishes no times: routers then go by what they
    sent."""
    if not isinstance(policy, ClockworkScheduler):
        return CellSignal(cell, now_ns, devices, {}, now_ns)
    residency = policy.residency
    finish: dict[str, int] = {}
    for model in models:
        best: int | None = None
        for device in residency.holding(model):
            start = max(now_ns, device.exec_lane.free_ns, device.ready_ns.get(model, now_ns))
            end = start + policy.shapes.exec_ns(model, 1, device.kind)
            best = end if best is None else min(best, end)
        if best is not None:
            finish[model] = best
    live = [d for d in residency.devices if not d.removed]
    cold = min((max(now_ns, d.load_lane.free_ns) for d in live), default=now_ns)
    return CellSignal(cell, now_ns, max(devices, 1), finish, cold)
