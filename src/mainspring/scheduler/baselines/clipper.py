"""Clipper-like baseline: the batch size adapts by AIMD against the SLO."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mainspring.models.profile import ModelProfile
from mainspring.protocol import DeviceSpec, Request
from mainspring.scheduler.baselines.reactive import ReactiveConfig, ReactiveScheduler


class ClipperScheduler(ReactiveScheduler):
    """As Clipper: add one to a model's batch cap while batches finish within the SLO,
    cut it by ``backoff`` (10%) when one does not."""

    def __init__(
        self,
        profiles: Mapping[str, ModelProfile],
        devices: Sequence[DeviceSpec],
        config: ReactiveConfig,
        backoff: float = 0.9,
    ) -> None:
        super().__init__(profiles, devices, config)
        if not 0 < backoff < 1:
            raise ValueError(f"backoff must lie in (0, 1), got {backoff}")
        self._backoff = backoff
        self._caps: dict[str, float] = {}

    def batch_limit(self, model: str) -> int:
        return min(int(self._caps.get(model, 1.0)), super().batch_limit(model))

    def on_batch_done(self, model: str, requests: Sequence[Request], duration_ns: int) -> None:
        cap = self._caps.get(model, 1.0)
        slo_ns = min(r.slo_ns for r in requests)
        if duration_ns <= slo_ns:
            cap = min(cap + 1.0, float(super().batch_limit(model)))
        else:
            cap = max(1.0, cap * self._backoff)
        self._caps[model] = cap
