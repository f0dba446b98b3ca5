"""Stranded models that replicas on the way already cover, set aside until that could change.

Every pass checks each stranded model (``StrandCheck.spill``). Most of them
(97% at 32 and at 150 overloaded devices, 32 models a pass at 150) are covered: the holders still
loading the model can serve its whole queue, so nothing is done, and the next pass asks again.
Whether they still cover it depends only on the model's queue (its head and its count), the exec
lanes of the loading holders that were counted, the model's loads and holders, its estimates,
and the clock once the clock passes the time at which a counted holder's lane and load are both
free (``until``). So a covered model is set aside until one of those changes; the policy marks
the changes and hands them here before each check. The decisions are those of checking every
model on every pass (``tests/scheduler/test_indices.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, KeysView


class SettledStrands:
    """Covered stranded models, each with the devices whose exec lanes its cover counts."""

    def __init__(self) -> None:
        self.released: set[str] = set()  # models set free since the policy last cleared this
        self._until: dict[str, int] = {}  # the models set aside, each until when
        self._devices_of: dict[str, tuple[int, ...]] = {}
        self._on_device: dict[int, set[str]] = {}  # device -> models whose cover counts its exec lane
        self._by_time: list[tuple[int, str]] = []  # (until, model); stale entries are skipped

    @property
    def models(self) -> KeysView[str]:
        """The models set aside."""
        return self._until.keys()

    def settle(self, model: str, until_ns: int, devices: tuple[int, ...]) -> None:
        """``model`` is covered as long as nothing changes and the clock stays at or before ``until_ns``."""
        self._until[model] = until_ns
        self._devices_of[model] = devices
        for device in devices:
            self._on_device.setdefault(device, set()).add(model)
        heapq.heappush(self._by_time, (until_ns, model))

    def unsettle(self, models: Iterable[str]) -> None:
        for model in models:
            if self._until.pop(model, None) is None:
                continue
            self.released.add(model)
            for device in self._devices_of.pop(model):
                on_device = self._on_device.get(device)
                if on_device is not None:
                    on_device.discard(model)

    def lanes_moved(self, devices: Iterable[int]) -> None:
        """The exec lanes of ``devices`` moved: the models whose cover counts them are checked again."""
        for device in devices:
            models = self._on_device.pop(device, None)
            if models:
                self.unsettle(models)

    def expire(self, now_ns: int) -> None:
        """The clock passed some models' ``until``: they are checked again."""
        by_time = self._by_time
        while by_time and by_time[0][0] < now_ns:
            until, model = heapq.heappop(by_time)
            if self._until.get(model) == until:
                self.unsettle((model,))

    def clear(self) -> None:
        """Every model is checked again (e.g. a kind's estimates moved)."""
        self.released.update(self._until)
        self._until.clear()
        self._devices_of.clear()
        self._on_device.clear()
        self._by_time.clear()
