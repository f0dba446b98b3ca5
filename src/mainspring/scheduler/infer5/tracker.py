"""INFER5's load tracker (``controller/infer5/load_tracker.cpp`` at fbd2f11): INFER4's (``infer4/demand.py``)
with two differences of the source's own.

- Deferred: a request's demand, its execution and completion, and a load's end are noted per model
  (``ModelLoadTracker``'s atomics and event queue) and applied by a tracker thread of its own. Here they
  apply at the policy's first call at a later instant (``advance``), and the policy wakes
  ``TRACKER_LAG_NS`` later while any wait (the thread polls every 10 us). A load decision and an eviction
  (``loadModel``, ``evictModel``) act at once, as in the source.
- Load demand does not lapse at its weights deadline. The source's ``process`` reads ``new_loadweights``
  after ``exchange(0)`` when it files a request's deadline, so what lapses there is 0: a request's load
  demand is withdrawn only when it runs (``executing``) or times out (``cancelled``). INFER5 is therefore
  more eager to load than INFER4.

INFER4's reading of the source's "all demand satisfied" test (a pointer compared with zero in both
trackers) is kept: a model whose holders already serve its demand is not loaded again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mainspring.scheduler.infer4.demand import Demand, LoadTracker

TRACKER_LAG_NS = 10_000  # the tracker thread's poll (usleep(10))


@dataclass(slots=True)
class _Noted:
    """What one model's ``ModelLoadTracker`` holds between two runs of the tracker thread."""

    new_exec: float = 0.0
    new_load: float = 0.0
    done_exec: float = 0.0
    done_load: float = 0.0
    touched: set[int] = field(default_factory=set)  # devices that ran or finished its requests
    loads: list[tuple[int, bool]] = field(default_factory=list)  # (device, succeeded) of loads that ended


class DeferredLoadTracker(LoadTracker):
    """INFER4's tracker, its per-request updates noted and applied later, its load demand never lapsing."""

    def __init__(self, capacity_ns: int) -> None:
        super().__init__(capacity_ns)
        self._noted: dict[str, _Noted] = {}  # in the order models went stale (the source's ``stale`` queue)
        self._noted_at = 0  # when the notes were taken (all at one instant: they apply at the next)
        self._now = 0

    @property
    def pending(self) -> bool:
        return bool(self._noted)

    def advance(self, now_ns: int) -> bool:
        """The policy's clock at each call; what was noted at an earlier instant applies first. True if
        anything applied (demand changed: the devices ask for loads again)."""
        self._now = now_ns
        if not self._noted or self._noted_at >= now_ns:
            return False
        noted, self._noted = self._noted, {}
        for name, note in noted.items():
            self._apply(name, note)
        return True

    def _note(self, model: str) -> _Noted:
        if not self._noted:
            self._noted_at = self._now
        noted = self._noted.get(model)
        if noted is None:
            noted = self._noted[model] = _Noted()
        return noted

    # --- noted, as the source's ModelLoadTracker -----------------------------------------
    def add_request(self, model: str, size_ns: int, exec_slo_ns: int, load_slo_ns: int, now_ns: int) -> Demand:
        self.advance(now_ns)
        self._model(model)
        demand = Demand(model, size_ns * self.capacity / exec_slo_ns, size_ns * self.capacity / load_slo_ns)
        noted = self._note(model)
        noted.new_exec += demand.exec_size
        noted.new_load += demand.load_size
        return demand

    def executing(self, demands: list[Demand], device: int) -> None:
        """A batch was sent: its requests no longer need a load."""
        noted = self._note(demands[0].model)
        for demand in demands:
            noted.done_load += demand.load_size
            demand.load_size = 0.0
        noted.touched.add(device)

    def completed(self, demands: list[Demand], device: int | None) -> None:
        """Requests left the system: run (the source's ``completed``) or timed out (``cancelled``)."""
        if not demands:
            return
        noted = self._note(demands[0].model)
        for demand in demands:
            noted.done_exec += demand.exec_size
            noted.done_load += demand.load_size
            demand.exec_size = demand.load_size = 0.0
        if device is not None:
            noted.touched.add(device)

    def load_finished(self, name: str, device: int, ok: bool) -> None:
        self._note(name).loads.append((device, ok))

    def check_load_deadlines(self, now_ns: int) -> None:
        """Nothing lapses (see the module's text)."""

    def _apply(self, name: str, note: _Noted) -> None:
        m = self._model(name)
        m.outstanding_exec += note.new_exec - note.done_exec
        m.outstanding_load += note.new_load - note.done_load
        for device in sorted(note.touched):
            m.last_used[device] = self._next_seq()
        for device, ok in note.loads:
            self._finish_load(m, device, ok)
        self._distribute(name)

    def forget(self, name: str) -> None:
        self._noted.pop(name, None)
        super().forget(name)
