"""What Clockwork's lanes say of the near future, for a cell's load signal (``scheduler.base.Forecasts``)."""

from __future__ import annotations

from collections.abc import Iterable

from mainspring.scheduler.base import Forecast
from mainspring.scheduler.clockwork.residency import Residency
from mainspring.scheduler.clockwork.shapes import BatchShapes


def lane_forecast(residency: Residency, shapes: BatchShapes, models: Iterable[str], now_ns: int) -> Forecast:
    """Per model of ``models`` held, the earliest end of a batch of one on a holder (its exec lane's
    booked time, then the batch); ``cold_start_ns``: the earliest a load lane frees. Reads only: no
    decision changes."""
    finish: dict[str, int] = {}
    for model in models:
        best: int | None = None
        for device in residency.holding(model):
            start = max(now_ns, device.exec_lane.free_ns, device.ready_ns.get(model, now_ns))
            end = start + shapes.exec_ns(model, 1, device.kind)
            best = end if best is None else min(best, end)
        if best is not None:
            finish[model] = best
    live = [d for d in residency.devices if not d.removed]
    return Forecast(finish, min((max(now_ns, d.load_lane.free_ns) for d in live), default=now_ns))
