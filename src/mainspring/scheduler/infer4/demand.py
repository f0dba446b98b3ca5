"""Clockwork's load tracker (``load_tracker.cpp``): demand per model, load priority, eviction order.

Every request adds demand to its model: ``exec`` (its batch-1 time as a share of the
time it has to start executing, scaled by ``capacity``) and ``load`` (the same over the
time in which a load could still help it). Executing a request completes its load
demand; finishing it completes its exec demand; load demand also lapses when its
weights deadline passes. A model's exec demand is spread over the devices holding it
in proportion to their weight (capacity / outstanding work). Load priority on a device
that does not hold the model: outstanding load demand minus what the holders serve.
Eviction: models without demand first, least recently used first.

Ported as published, with one reading made explicit: the source's "all demand
satisfied" test compares a pointer with zero (always false); we apply the test it
names (priority > 0), so a model whose demand its holders already serve is not loaded
again. ``docs/scheduler/infer4-and-infer5.md`` lists this among infer4's readings of the source.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

GPU_BASE_OUTSTANDING = 1_000_000  # the source assumes 1 ms of work on every device


@dataclass(slots=True)
class Demand:
    """What one request added to its model's demand (zeroed as it is completed)."""

    model: str
    exec_size: float
    load_size: float


@dataclass(slots=True)
class _Model:
    outstanding_exec: float = 0.0
    outstanding_load: float = 0.0
    devices: set[int] = field(default_factory=set)  # holding or loading
    loading: set[int] = field(default_factory=set)
    allocations: dict[int, float] = field(default_factory=dict)
    last_used: dict[int, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.outstanding_exec <= 0 and self.outstanding_load <= 0


class LoadTracker:
    """Per-model demand and per-device outstanding work, in the source's units (ns x capacity)."""

    def __init__(self, capacity_ns: int) -> None:
        self.capacity = float(capacity_ns)
        self._models: dict[str, _Model] = {}
        self._outstanding: dict[int, float] = {}  # device -> outstanding exec demand
        self._weight: dict[int, float] = {}
        self._load_deadlines: list[tuple[int, int, Demand]] = []
        self._seq = 0
        self.active: set[str] = set()  # models with outstanding demand

    def add_device(self, device: int) -> None:
        self._outstanding[device] = GPU_BASE_OUTSTANDING
        self._weight[device] = 0.01

    def remove_device(self, device: int) -> None:
        for model in self._models.values():
            model.devices.discard(device)
            model.loading.discard(device)
            self._outstanding[device] -= model.allocations.pop(device, 0.0)
        del self._outstanding[device], self._weight[device]
        for name in list(self._models):
            self._distribute(name)

    def _model(self, name: str) -> _Model:
        model = self._models.get(name)
        if model is None:
            model = self._models[name] = _Model()
        return model

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # --- demand --------------------------------------------------------------------
    def add_request(self, model: str, size_ns: int, exec_slo_ns: int, load_slo_ns: int, now_ns: int) -> Demand:
        self.check_load_deadlines(now_ns)
        demand = Demand(model, size_ns * self.capacity / exec_slo_ns, size_ns * self.capacity / load_slo_ns)
        heapq.heappush(self._load_deadlines, (now_ns + load_slo_ns, self._next_seq(), demand))
        m = self._model(model)
        m.outstanding_exec += demand.exec_size
        m.outstanding_load += demand.load_size
        self._distribute(model)
        return demand

    def executing(self, demands: list[Demand], device: int) -> None:
        """A batch was sent: its requests no longer need a load."""
        m = self._model(demands[0].model)
        for demand in demands:
            m.outstanding_load -= demand.load_size
            demand.load_size = 0.0
        m.last_used[device] = self._next_seq()
        self._distribute(demands[0].model)

    def completed(self, demands: list[Demand], device: int | None) -> None:
        """Requests left the system (answered, dropped or cancelled)."""
        if not demands:
            return
        m = self._model(demands[0].model)
        for demand in demands:
            m.outstanding_exec -= demand.exec_size
            m.outstanding_load -= demand.load_size
            demand.exec_size = demand.load_size = 0.0
        if device is not None:
            m.last_used[device] = self._next_seq()
        self._distribute(demands[0].model)

    def check_load_deadlines(self, now_ns: int) -> None:
        """Load demand lapses once a load could no longer help the request."""
        deadlines = self._load_deadlines
        touched = set()
        while deadlines and deadlines[0][0] < now_ns:
            _, _, demand = heapq.heappop(deadlines)
            if demand.load_size:
                self._model(demand.model).outstanding_load -= demand.load_size
                demand.load_size = 0.0
                touched.add(demand.model)
        for model in sorted(touched):  # sorted: the devices' outstanding sums add up in one order in every process
            self._distribute(model)

    def _distribute(self, name: str) -> None:
        m = self._models[name]
        for device, allocation in m.allocations.items():
            if device in self._outstanding:
                self._outstanding[device] -= allocation
        m.allocations.clear()
        if m.empty:
            self.active.discard(name)
        else:
            self.active.add(name)
        if not m.devices:
            return
        total_weight = sum(self._weight[d] for d in m.devices)
        for device in m.devices:
            allocation = m.outstanding_exec * self._weight[device] / total_weight
            m.allocations[device] = allocation
            self._outstanding[device] += allocation
            self._weight[device] = self.capacity / max(self._outstanding[device], 1.0)

    # --- residency -----------------------------------------------------------------
    def load_started(self, name: str, device: int) -> None:
        m = self._model(name)
        m.devices.add(device)
        m.loading.add(device)
        m.last_used[device] = self._next_seq()
        self._distribute(name)

    def load_finished(self, name: str, device: int, ok: bool) -> None:
        self._finish_load(self._model(name), device, ok)
        self._distribute(name)

    def _finish_load(self, m: _Model, device: int, ok: bool) -> None:
        """A load on ``device`` ended: the model is used there now, or not there at all."""
        m.loading.discard(device)
        if ok:
            m.last_used[device] = self._next_seq()
        else:
            m.devices.discard(device)

    def evicted(self, name: str, device: int) -> None:
        m = self._model(name)
        m.devices.discard(device)
        m.loading.discard(device)
        self._distribute(name)

    def forget(self, name: str) -> None:
        m = self._models.pop(name, None)
        if m is not None:
            for device, allocation in m.allocations.items():
                if device in self._outstanding:
                    self._outstanding[device] -= allocation
        self.active.discard(name)

    # --- decisions -----------------------------------------------------------------
    def load_priority(self, name: str) -> float:
        m = self._models[name]
        priority = m.outstanding_load
        if priority > 0 and m.devices:
            total_weight = sum(self._weight[d] for d in m.devices)
            for device in m.devices:
                required = m.outstanding_load * self._weight[device] / total_weight
                priority -= self.capacity * required / max(self._outstanding[device], 1.0)
        return priority

    def model_to_load(self, device: int) -> str | None:
        """The model with outstanding demand and the highest positive load priority that
        ``device`` does not hold (ties: the most recently used there)."""
        best: tuple[float, int, str] | None = None  # the name breaks ties: runs repeat across processes
        chosen = None
        for name in self.active:
            m = self._models[name]
            if device in m.devices:
                continue
            key = (self.load_priority(name), m.last_used.get(device, 0), name)
            if best is None or key > best:
                best, chosen = key, name
        if best is None or best[0] <= 0:
            return None
        return chosen

    def eviction_order(self, device: int, held: list[str]) -> list[str]:
        """``held`` (loaded, not loading) in the order the source evicts: models without demand
        first, then the rest, each least recently used first."""
        models = self._models

        def key(name: str) -> tuple[bool, int]:
            m = models.get(name)
            if m is None:
                return (False, 0)
            return (not m.empty, m.last_used.get(device, 0))

        return sorted(held, key=key)
