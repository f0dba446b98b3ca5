"""Duration estimates: a high percentile of a rolling window of measurements.

Per (model, batch size, device kind) for inference and per (model, device kind)
for weight loads; seeded from the model's profile until measurements arrive.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from mainspring.models.profile import ModelProfile


class RollingPercentile:
    """The ``percentile`` of the last ``window`` values (nearest rank), cached between updates."""

    __slots__ = ("_percentile", "_values", "value")

    def __init__(self, seed_value: int, window: int, percentile: float) -> None:
        self._values: deque[int] = deque(maxlen=window)
        self._percentile = percentile
        self.value = seed_value

    def add(self, measured: int) -> None:
        self._values.append(measured)
        ordered = sorted(self._values)
        rank = max(1, math.ceil(self._percentile / 100.0 * len(ordered)))
        self.value = ordered[rank - 1]


class Estimator:
    """What the controller expects each action to take."""

    def __init__(self, profiles: Mapping[str, ModelProfile], window: int = 10, percentile: float = 99.0) -> None:
        if window < 1 or not 0 < percentile <= 100:
            raise ValueError(f"bad estimator settings: window={window}, percentile={percentile}")
        self._profiles = profiles
        self._window = window
        self._percentile = percentile
        self._exec: dict[tuple[str, int, str], RollingPercentile] = {}
        self._load: dict[tuple[str, str], RollingPercentile] = {}

    def _exec_entry(self, model: str, batch_size: int, kind: str) -> RollingPercentile:
        key = (model, batch_size, kind)
        entry = self._exec.get(key)
        if entry is None:
            seed = self._profiles[model].exec_ns[batch_size]
            entry = self._exec[key] = RollingPercentile(seed, self._window, self._percentile)
        return entry

    def _load_entry(self, model: str, kind: str) -> RollingPercentile:
        key = (model, kind)
        entry = self._load.get(key)
        if entry is None:
            entry = self._load[key] = RollingPercentile(self._profiles[model].load_ns, self._window, self._percentile)
        return entry

    def exec_ns(self, model: str, batch_size: int, kind: str) -> int:
        """Estimate for a supported batch size."""
        return self._exec_entry(model, batch_size, kind).value

    def load_ns(self, model: str, kind: str) -> int:
        return self._load_entry(model, kind).value

    def observe_exec(self, model: str, batch_size: int, kind: str, measured_ns: int) -> None:
        self._exec_entry(model, batch_size, kind).add(measured_ns)

    def observe_load(self, model: str, kind: str, measured_ns: int) -> None:
        self._load_entry(model, kind).add(measured_ns)


class DecayingRate:
    """Exponentially decaying sum of work per unit time: the share of a device that
    arrivals have recently asked for (1.0: all of it). ``tau_ns`` sets the memory."""

    __slots__ = ("_at_ns", "_tau_ns", "_value")

    def __init__(self, tau_ns: int) -> None:
        self._tau_ns = tau_ns
        self._value = 0.0
        self._at_ns = 0

    def value(self, now_ns: int) -> float:
        if now_ns > self._at_ns:
            self._value *= math.exp((self._at_ns - now_ns) / self._tau_ns)
            self._at_ns = now_ns
        return self._value

    def add(self, work_ns: float, now_ns: int) -> None:
        self._value = self.value(now_ns) + work_ns / self._tau_ns
