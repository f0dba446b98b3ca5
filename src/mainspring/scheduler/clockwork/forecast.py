"""What Clockwork's lanes say of the near future, for a cell's load signal (``scheduler.base.Forecasts``)."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from mainspring.scheduler.base import Forecast
from mainspring.scheduler.clockwork.residency import Residency
from mainspring.scheduler.clockwork.shapes import BatchShapes


def lane_forecast(residency: Residency, shapes: BatchShapes, models: Iterable[str], now_ns: int) -> Forecast:
    """Per model of ``models`` held, the earliest end of a batch of one on a holder (its exec lane's
    booked time, then the batch); ``cold_start_ns``: the earliest a load lane frees. Reads only: no
    decision changes. Walks each device's held models once (a cell publishes this every few ms, for
    every model it serves)."""
    wanted = models if isinstance(models, Collection) else set(models)
    finish: dict[str, int] = {}
    cold_start: int | None = None
    for device in residency.devices:
        if device.removed:
            continue
        load_free = max(now_ns, device.load_lane.free_ns)
        cold_start = load_free if cold_start is None else min(cold_start, load_free)
        lane = max(now_ns, device.exec_lane.free_ns)
        known = shapes.of_kind(device.kind)
        for model, ready in device.ready_ns.items():
            if model not in wanted:
                continue
            table = (known.get(model) or shapes.estimates(model, device.kind))[0]
            one = table[0][1] if table[0][0] == 1 else shapes.exec_ns(model, 1, device.kind)
            end = (ready if ready > lane else lane) + one
            best = finish.get(model)
            if best is None or end < best:
                finish[model] = end
    return Forecast(finish, now_ns if cold_start is None else cold_start)
