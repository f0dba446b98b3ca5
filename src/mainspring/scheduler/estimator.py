"""Duration estimates: a high percentile of a rolling window of measurements.

Per (model, batch size, device kind) for inference and per (model, device kind)
for weight loads; seeded from the model's profile until measurements arrive.
A window not measured for ``max_age_ns`` is forgotten: one stall measured on a shared
machine would otherwise hold a model's estimate above every SLO, so that no request is
admitted and no new measurement ever replaces it.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

from mainspring.models.profile import ModelProfile

_K = TypeVar("_K", bound=Hashable)


class RollingPercentile:
    """The ``percentile`` of the last ``window`` values (nearest rank), cached between updates. The
    values are also kept sorted (a kind's window of 100 is updated with every result).

    ``corroborated`` is what a window supports as if it were full: the value at the full window's
    rank counted from the top (at p90 of ten, the second largest), 0 while it holds fewer values.
    The nearest rank of a few values is their largest, so one stall caught by a size that rarely
    runs stood as its estimate, kept the size from running and was never measured away; a full
    window at p90 outvotes one stall, and so does this. At p99 of ten both are the largest.
    """

    __slots__ = (
        *("_percentile", "_seed", "_sorted", "_top", "_values"),
        *("added", "corroborated", "count", "full", "value"),
    )

    def __init__(self, seed_value: int, window: int, percentile: float) -> None:
        self._values: deque[int] = deque(maxlen=window)
        self._sorted: list[int] = []
        self._percentile = percentile
        self._seed = seed_value
        self.value = seed_value
        self.corroborated = 0
        self._top = window - max(1, math.ceil(percentile / 100.0 * window)) + 1  # the full rank, from the top
        self.count = 0
        self.added = 0  # values ever added: numbers them, so that an expiry can tell if one is still held
        self.full = False

    def add(self, measured: int) -> None:
        if self.full:
            self._unsort(self._values[0])  # the deque drops it on append
        self._values.append(measured)
        bisect.insort(self._sorted, measured)
        self.added += 1
        self._update()

    def holds(self, serial: int) -> bool:
        """Is the ``serial``-th value added (counting from 1) still in the window?"""
        return serial > self.added - len(self._values)

    def drop_oldest(self) -> None:
        self._unsort(self._values.popleft())
        self._update()

    def clear(self) -> None:
        self._values.clear()
        self._sorted.clear()
        self._update()

    def _unsort(self, value: int) -> None:
        del self._sorted[bisect.bisect_left(self._sorted, value)]

    def _update(self) -> None:
        values = self._values
        self.count = len(values)
        self.full = self.count == values.maxlen
        if not values:
            self.value = self._seed
            self.corroborated = 0
            return
        rank = max(1, math.ceil(self._percentile / 100.0 * self.count))
        self.value = self._sorted[rank - 1]
        self.corroborated = self._sorted[self.count - self._top] if self.count >= self._top else 0


PPM = 1_000_000
# An estimate this far above what the profile predicts is taken for a stale stall: a size's window
# is forgotten (``Estimator._forget_suspects``), a model it refuses is probed (the policy's ``_probe``).
STALE_FACTOR = 1.5
# per (model, kind), for ``Estimator.exec_table``: sizes, their profile figures, (position, window) of those measured
_Row = tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, "RollingPercentile"], ...]]
KIND_WINDOW = 100


class Estimator:
    """What the controller expects each action to take.

    With thousands of models many run rarely, so their own windows stay short and a
    profile figure is a median, not a p99. Until a model's window is full, its estimate
    is the larger of what the window corroborates (``RollingPercentile.corroborated``)
    and its profile figure times the device kind's p99 ratio of measured to profiled
    time (over the last 100 actions of every model on that kind). With ``suspect_age_ns``
    a size held far above that is forgotten when not measured for so long (``_forget_suspects``).
    """

    def __init__(
        self,
        profiles: Mapping[str, ModelProfile],
        window: int = 10,
        percentile: float = 99.0,
        borrow_kind_ratio: bool = True,
        max_age_ns: int | None = None,
        kind_percentiles: Mapping[str, float] | None = None,
        suspect_age_ns: int | None = None,
    ) -> None:
        kind_percentiles = dict(kind_percentiles or {})
        percentiles = [percentile, *kind_percentiles.values()]
        if window < 1 or not all(0 < p <= 100 for p in percentiles) or (max_age_ns is not None and max_age_ns <= 0):
            raise ValueError(f"bad estimator settings: window={window}, percentile={percentile}, max age {max_age_ns}")
        self._profiles = profiles
        self._window = window
        self._percentile = percentile
        self._kind_percentiles = kind_percentiles  # device kinds estimated at their own percentile
        self._borrow = borrow_kind_ratio  # False: Clockwork's own estimator (profile until measured)
        self._exec: dict[tuple[str, int, str], RollingPercentile] = {}
        self._rows: dict[tuple[str, str], _Row] = {}  # (model, kind) -> see ``exec_table``
        self._load: dict[tuple[str, str], RollingPercentile] = {}
        self._exec_ratio: dict[str, RollingPercentile] = {}
        self._load_ratio: dict[str, RollingPercentile] = {}
        self._max_age_ns = max_age_ns
        # when, window, serial, whole (a model's window, not a ratio), and what it changes (``_changed``)
        self._observed: deque[tuple[int, RollingPercentile, int, bool, tuple[str, str] | str | None]] = deque()
        self._suspect_age_ns = suspect_age_ns  # see ``_forget_suspects``
        # every exec measurement while that is set: when, window, serial, model, kind, batch size
        self._measured: deque[tuple[int, RollingPercentile, int, str, str, int]] = deque()
        self._watchers: list[Callable[[str, str | None], None]] = []  # see ``watch``
        self._follower: Estimator | None = None  # see ``feed``

    def feed(self, follower: Estimator) -> None:
        """Hand every measurement, expiry and forgotten model on to ``follower`` too (an estimator of
        the same durations at other percentiles, e.g. admission's)."""
        self._follower = follower

    def forget(self, model: str) -> None:
        """Drop a model's measurements (it was unloaded; a new version starts from its profile)."""
        if self._follower is not None:
            self._follower.forget(model)
        for row_key in [k for k in self._rows if k[0] == model]:
            del self._rows[row_key]
        for key in [k for k in self._exec if k[0] == model]:
            del self._exec[key]
            self._changed((model, key[2]))
        for load_key in [k for k in self._load if k[0] == model]:
            del self._load[load_key]

    def _entry(self, table: dict[_K, RollingPercentile], key: _K, kind: str, profiled: int) -> RollingPercentile:
        entry = table.get(key)
        if entry is None:
            entry = table[key] = RollingPercentile(profiled, self._window, self._percentile_of(kind))
        return entry

    def _exec_window(self, model: str, batch_size: int, kind: str, profiled: int) -> RollingPercentile:
        key = (model, batch_size, kind)
        if key not in self._exec:
            self._rows.pop((model, kind), None)  # ``exec_table`` must find the new window
        return self._entry(self._exec, key, kind, profiled)

    def _ratio(self, table: dict[str, RollingPercentile], kind: str) -> RollingPercentile:
        entry = table.get(kind)
        if entry is None:
            entry = table[kind] = RollingPercentile(PPM, KIND_WINDOW, self._percentile_of(kind))
        return entry

    def _percentile_of(self, kind: str) -> float:
        return self._kind_percentiles.get(kind, self._percentile)

    def _estimate(self, entry: RollingPercentile | None, ratio: RollingPercentile | None, profiled: int) -> int:
        if entry is not None and (entry.full or (entry.count and not self._borrow)):
            return entry.value
        if not self._borrow:
            return profiled
        corrected = profiled if ratio is None else profiled * ratio.value // PPM
        return corrected if entry is None else max(entry.corroborated, corrected)

    def exec_ns(self, model: str, batch_size: int, kind: str) -> int:
        """Estimate for a supported batch size. (On the scheduler's hot path: no allocation.)"""
        entry = self._exec.get((model, batch_size, kind))
        if entry is not None and entry.full:
            return entry.value
        profiled = self._profiles[model].exec_ns[batch_size]
        return self._estimate(entry, self._exec_ratio.get(kind), profiled)

    def exec_table(self, model: str, sizes: tuple[int, ...], kind: str) -> list[int]:
        """``exec_ns`` of each of ``sizes``, in one go: the planner recomputes a model's whole table
        whenever the kind's ratio moves (every ~4 ms at 32 devices; every model not yet fully
        measured borrows it), so the profile figures and the windows are found once per model
        (``_row``) and the ratio is applied to them all, then the windows measured override it."""
        row = self._rows.get((model, kind))
        if row is None or row[0] != sizes:
            row = self._row(model, sizes, kind)
        _, profiled, windows = row
        if not self._borrow:
            estimates = list(profiled)
            for i, entry in windows:
                if entry.count:
                    estimates[i] = entry.value
            return estimates
        ratio = self._exec_ratio.get(kind)
        if ratio is None:
            estimates = list(profiled)
        else:
            scale = ratio.value
            estimates = [p * scale // PPM for p in profiled]
        for i, entry in windows:  # a full window is the estimate; a partial one is at least the ratio's
            if entry.full or entry.corroborated > estimates[i]:
                estimates[i] = entry.corroborated
        return estimates

    def _row(self, model: str, sizes: tuple[int, ...], kind: str) -> _Row:
        """``exec_table``'s profile figures of ``sizes`` and the windows they have, by position."""
        profiled = self._profiles[model].exec_ns
        found = [(i, self._exec.get((model, size, kind))) for i, size in enumerate(sizes)]
        windows = tuple((i, entry) for i, entry in found if entry is not None)
        row = self._rows[(model, kind)] = (sizes, tuple(profiled[size] for size in sizes), windows)
        return row

    def load_ns(self, model: str, kind: str) -> int:
        entry = self._load.get((model, kind))
        return self._estimate(entry, self._load_ratio.get(kind), self._profiles[model].load_ns)

    def observe_exec(self, model: str, batch_size: int, kind: str, measured_ns: int, at_ns: int) -> None:
        if self._follower is not None:
            self._follower.observe_exec(model, batch_size, kind, measured_ns, at_ns)
        profiled = self._profiles[model].exec_ns[batch_size]
        entry = self._exec_window(model, batch_size, kind, profiled)
        self._add(entry, measured_ns, at_ns, True, (model, kind))
        self._add(self._ratio(self._exec_ratio, kind), measured_ns * PPM // max(profiled, 1), at_ns, False, kind)
        if self._suspect_age_ns is not None:
            self._measured.append((at_ns, entry, entry.added, model, kind, batch_size))

    def observe_load(self, model: str, kind: str, measured_ns: int, at_ns: int) -> None:
        if self._follower is not None:
            self._follower.observe_load(model, kind, measured_ns, at_ns)
        profiled = self._profiles[model].load_ns
        self._add(self._entry(self._load, (model, kind), kind, profiled), measured_ns, at_ns, True, None)
        self._add(self._ratio(self._load_ratio, kind), measured_ns * PPM // max(profiled, 1), at_ns, False, None)

    def restart_exec(self, model: str, batch_size: int, kind: str, measured_ns: int, at_ns: int) -> None:
        """A probe's measurement replaces the window: the whole window, so that neither older values
        nor the kind's ratio (which lifts windows not yet full) keep the estimate that refused it."""
        if self._follower is not None:
            self._follower.restart_exec(model, batch_size, kind, measured_ns, at_ns)
        profiled = self._profiles[model].exec_ns[batch_size]
        entry = self._exec_window(model, batch_size, kind, profiled)
        entry.clear()
        for _ in range(self._window):
            self._add(entry, measured_ns, at_ns, True, (model, kind))
        self._add(self._ratio(self._exec_ratio, kind), measured_ns * PPM // max(profiled, 1), at_ns, False, kind)

    def _add(
        self, window: RollingPercentile, value: int, at_ns: int, whole: bool, changes: tuple[str, str] | str | None
    ) -> None:
        before = window.value
        window.add(value)
        if changes is not None and (whole or window.value != before):
            self._changed(changes)
        if self._max_age_ns is not None:
            self._observed.append((at_ns, window, window.added, whole, changes))

    def watch(self, changed: Callable[[str, str | None], None]) -> None:
        """Have ``changed(kind, model)`` called whenever a model's exec windows on a kind change, and
        ``changed(kind, None)`` when the value of the kind's exec ratio does (which every model not
        fully measured borrows), so that callers can keep values derived from the estimates."""
        self._watchers.append(changed)

    def _changed(self, changes: tuple[str, str] | str) -> None:
        """Tell the watchers: a model's exec windows on a kind changed ``(model, kind)``, or a kind's ratio."""
        kind, model = (changes, None) if isinstance(changes, str) else (changes[1], changes[0])
        for changed in self._watchers:
            changed(kind, model)

    def expire(self, now_ns: int) -> None:
        """Age measurements out. A model's window is forgotten whole once it has not been measured
        for the maximum age (while measured it keeps its older values: a p99 needs them); one that
        stopped being measured, perhaps because its own estimate turned every request away, starts
        again from the profile. A kind's ratio window loses each value at that age."""
        if self._follower is not None:
            self._follower.expire(now_ns)
        if self._suspect_age_ns is not None:
            self._forget_suspects(now_ns - self._suspect_age_ns)
        if self._max_age_ns is None:
            return
        cutoff = now_ns - self._max_age_ns
        observed = self._observed
        while observed and observed[0][0] < cutoff:
            _, window, serial, whole, changes = observed.popleft()
            before = window.value
            if whole and window.added == serial:  # nothing measured since
                window.clear()
            elif not whole and window.holds(serial):  # oldest first: it is the window's oldest
                window.drop_oldest()
            else:
                continue
            if changes is not None and (whole or window.value != before):
                self._changed(changes)

    def _forget_suspects(self, cutoff_ns: int) -> None:
        """Forget a size's window whose estimate stands ``STALE_FACTOR`` above its profile figure
        times the kind's ratio and that has not been measured since ``cutoff_ns``. Such a size is
        rarely planned (a larger batch is avoided, a smaller one refused), so without this the
        stalls it caught would stand until the maximum age: on a shared CPU every size ended up
        held at a stall, batches of 8 at 3x their time, and a closed loop was refused over and
        over. Forgotten, the size borrows the ratio again, runs and is measured afresh."""
        measured = self._measured
        while measured and measured[0][0] < cutoff_ns:
            _, window, serial, model, kind, size = measured.popleft()
            if window.added != serial or not window.count or self._exec.get((model, size, kind)) is not window:
                continue  # measured since (that measurement is checked in its turn), or forgotten
            profiled = self._profiles[model].exec_ns[size]
            ratio = self._exec_ratio.get(kind)
            corrected = profiled if ratio is None else profiled * ratio.value // PPM
            if self.exec_ns(model, size, kind) > STALE_FACTOR * corrected:
                window.clear()
                self._changed((model, kind))


class DecayingRate:
    """Exponentially decaying sum of work per unit time: the share of a device that
    arrivals have recently asked for (1.0: all of it). ``tau_ns`` sets the memory.

    Reading does not change it: a value depends on what was added and when, not on when it
    was read, so a reader may skip reads it does not need (decayed at each read, the float
    it held drifted with every read taken)."""

    __slots__ = ("_at_ns", "_read", "_read_ns", "_tau_ns", "_value")

    def __init__(self, tau_ns: int) -> None:
        self._tau_ns = tau_ns
        self._value = 0.0
        self._at_ns = 0  # when ``_value`` was last added to
        self._read_ns = -1  # the last read after that, and its value (read again within the pass)
        self._read = 0.0

    def value(self, now_ns: int) -> float:
        if now_ns <= self._at_ns:
            return self._value
        if now_ns != self._read_ns:
            self._read_ns = now_ns
            self._read = self._value * math.exp((self._at_ns - now_ns) / self._tau_ns)
        return self._read

    def add(self, work_ns: float, now_ns: int) -> None:
        if now_ns > self._at_ns:
            self._value = self.value(now_ns) + work_ns / self._tau_ns
            self._at_ns = now_ns
        else:  # reported late: added to the newer value, as it stands
            self._value += work_ns / self._tau_ns
        self._read_ns = -1
