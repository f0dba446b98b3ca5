"""What INFER4's (and INFER5's) lanes say of the near future, for a cell's load signal
(``scheduler.base.Forecasts``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from mainspring.models.profile import ModelProfile
from mainspring.scheduler.base import Forecast
from mainspring.scheduler.estimator import Estimator

if TYPE_CHECKING:
    from mainspring.scheduler.infer4.state import Infer4Device


def device_forecast(
    devices: Iterable[Infer4Device],
    estimator: Estimator,
    profiles: Mapping[str, ModelProfile],
    models: Iterable[str],
    now_ns: int,
) -> Forecast:
    """Per model of ``models`` loaded or loading on a device, the earliest end of its smallest batch there
    (after the exec lane's booked work, and a load's end while it loads); ``cold_start_ns``: the earliest
    a load lane frees. Reads only."""
    devices = list(devices)
    finish: dict[str, int] = {}
    for model in (m for m in models if m in profiles):
        smallest = profiles[model].batch_sizes[0]
        ends = [
            max(now_ns, device.exec_lane.free_ns, device.load_lane.free_ns if model in device.loading else now_ns)
            + estimator.exec_ns(model, smallest, device.spec.kind)
            for device in devices
            if model in device.loaded or model in device.loading
        ]
        if ends:
            finish[model] = min(ends)
    cold = min((max(now_ns, device.load_lane.free_ns) for device in devices), default=now_ns)
    return Forecast(finish, cold)
