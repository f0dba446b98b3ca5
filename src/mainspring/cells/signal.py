"""A cell's load signal, read from its policy's forecast (``scheduler.base.Forecasts``)."""

from __future__ import annotations

from collections.abc import Iterable

from mainspring.cells.routing import CellSignal
from mainspring.scheduler.base import Forecasts


def cell_signal(cell: int, policy: object, devices: int, now_ns: int, models: Iterable[str]) -> CellSignal:
    """Per model of ``models`` the cell holds, the earliest end of a batch of one there, and the earliest
    a load could start. A policy that forecasts nothing (the reactive baselines) publishes no times:
    routers then go by what they sent."""
    if not isinstance(policy, Forecasts):
        return CellSignal(cell, now_ns, devices, {}, now_ns)
    forecast = policy.forecast(models, now_ns)
    return CellSignal(cell, now_ns, max(devices, 1), dict(forecast.finish_ns), forecast.cold_start_ns)
