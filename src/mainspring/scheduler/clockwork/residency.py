"""Where each model's weights are (or will be): devices, holders, pages, and residency generations.

Every hold starts a new *generation* of that model on that device. An action records the
generation it was planned for; a result for an older generation (the model was evicted,
unloaded, or unloaded and added again meanwhile) only frees its lane.
"""

from __future__ import annotations

from functools import partial

from mainspring.protocol import DeviceSpec
from mainspring.scheduler.clockwork.due import DueDevices, always
from mainspring.scheduler.clockwork.tier_order import WatchedSet
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.lanes import LaneTracker


def _exec_lane(device: DeviceState) -> LaneTracker:
    return device.exec_lane


def _load_lane(device: DeviceState) -> LaneTracker:
    return device.load_lane


def _has_waiting(device: DeviceState) -> bool:
    return bool(device.waiting)


class Residency:
    """The devices and which models they hold; ``cold`` are queued models held nowhere.
    ``exec_due``: devices with queued models by exec lane; ``load_due``: devices by load lane."""

    def __init__(self, specs: list[DeviceSpec], rate_memory_ns: int) -> None:
        self._rate_memory_ns = rate_memory_ns
        self.devices: list[DeviceState] = []
        self._by_id: dict[int, DeviceState] = {}
        self.kinds: list[str] = []
        self.holders: dict[str, set[int]] = {}
        self._holding: dict[str, tuple[DeviceState, ...]] = {}  # see ``holding``
        self.queued: set[str] = set()  # models with a request queue (kept by the policy)
        self.cold = WatchedSet()
        self._generation = 0
        self._added = 0
        self.exec_due = DueDevices(_exec_lane, _has_waiting)
        # What changed since the policy last cleared these (``SettledStrands`` is told):
        self.exec_moved: set[int] = set()  # devices whose exec lane's free time was predicted anew
        self.changed: set[str] = set()  # models held, released or loaded somewhere
        self.load_due = DueDevices(_load_lane, always)
        for spec in specs:
            self.add_device(spec)

    def device(self, device_id: int) -> DeviceState:
        return self._by_id[device_id]

    def find(self, device_id: int) -> DeviceState | None:
        return self._by_id.get(device_id)

    def holding(self, model: str) -> tuple[DeviceState, ...]:
        """The devices holding ``model`` (kept until its holders change: asked for on every pass)."""
        found = self._holding.get(model)
        if found is None:
            found = self._holding[model] = tuple(self._by_id[d] for d in self.holders.get(model, ()))
        return found

    def add_device(self, spec: DeviceSpec) -> None:
        if spec.device in self._by_id:
            raise ValueError(f"device {spec.device} is already known")
        device = DeviceState(spec, self._rate_memory_ns, self._added)
        self._added += 1
        device.exec_lane.moved = partial(self._exec_moved, device)
        device.load_lane.moved = partial(self.load_due.moved, device)
        self.load_due.moved(device)
        self.devices.append(device)
        self._by_id[spec.device] = device
        self.kinds = sorted({d.kind for d in self.devices})

    def _exec_moved(self, device: DeviceState) -> None:
        self.exec_due.moved(device)
        self.exec_moved.add(device.spec.device)

    def remove_device(self, device_id: int, pages_of: dict[str, int]) -> DeviceState:
        """Forget a device and everything it held; ``pages_of`` gives each held model's pages there."""
        device = self._by_id.pop(device_id)
        for model in list(device.ready_ns):
            self.release(device, model, pages_of[model])
        self.devices.remove(device)
        device.removed = True
        self.kinds = sorted({d.kind for d in self.devices})
        return device

    # --- holding ------------------------------------------------------------------------
    def hold(self, device: DeviceState, model: str, ready_ns: int, pages: int) -> int:
        """``model`` is (being) loaded on ``device``, usable from ``ready_ns``; returns its generation."""
        self._generation += 1
        device.ready_ns[model] = ready_ns
        device.generation[model] = self._generation
        device.free_pages -= pages
        device.touch(model, ready_ns)
        self.holders.setdefault(model, set()).add(device.spec.device)
        self._holding.pop(model, None)
        self.changed.add(model)
        if model in self.queued:
            self._wait(device, model)
            self.cold.discard(model)
        return self._generation

    def release(self, device: DeviceState, model: str, pages: int) -> None:
        """``model`` leaves ``device``: its pages are free and its in-flight actions are stale."""
        if device.ready_ns.pop(model, None) is None:
            return
        del device.generation[model]
        device.loading.discard(model)
        device.pinned.pop(model, None)
        device.free_pages += pages
        device.last_used.pop(model, None)
        device.waiting.discard(model)
        holders = self.holders[model]
        holders.discard(device.spec.device)
        self._holding.pop(model, None)
        self.changed.add(model)
        if not holders:
            del self.holders[model]
            if model in self.queued:
                self.cold.add(model)

    def loaded(self, device: DeviceState, model: str, ready_ns: int) -> None:
        """``model``'s load on ``device`` reported success: usable from ``ready_ns``."""
        device.ready_ns[model] = ready_ns
        device.loading.discard(model)
        self.changed.add(model)

    def is_current(self, device: DeviceState, model: str, generation: int) -> bool:
        return device.generation.get(model) == generation

    # --- queues opening and closing -------------------------------------------------------
    def queue_opened(self, model: str) -> None:
        self.queued.add(model)
        holders = self.holders.get(model)
        if holders:
            for device_id in holders:
                self._wait(self._by_id[device_id], model)
        else:
            self.cold.add(model)

    def _wait(self, device: DeviceState, model: str) -> None:
        if not device.waiting:
            self.exec_due.moved(device)  # it wants planning again
        device.waiting.add(model)

    def queue_closed(self, model: str) -> None:
        self.queued.discard(model)
        self.cold.discard(model)
        for device_id in self.holders.get(model, ()):
            self._by_id[device_id].waiting.discard(model)
