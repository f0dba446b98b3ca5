"""Emulated devices: exact (or noisy) durations from profiles, no real compute.

Each device has an exec lane and a weight-load lane. A lane runs one action at a
time, in order of ``earliest_ns``, waiting for the window to open; an action that
cannot start inside its window is refused and nothing runs. The page pool refuses
a load that does not fit. Used by the simulator and by tests of the live system.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from mainspring.models.profile import ModelProfile
from mainspring.protocol import (
    Action,
    ActionResult,
    ActionStatus,
    DeviceSpec,
    EvictWeights,
    Infer,
    LoadWeights,
    Timing,
)
from mainspring.protocol.results import window_refusal
from mainspring.time import NS_PER_S, Timer
from mainspring.worker.pages import PagePool

ResultSink = Callable[[ActionResult], None]


@dataclass(frozen=True)
class NoiseModel:
    """Multiplicative noise on every duration: log-normal jitter plus rare tail spikes."""

    jitter_sigma: float = 0.02
    spike_probability: float = 1e-4
    spike_min_factor: float = 1.5
    spike_max_factor: float = 3.0

    def __post_init__(self) -> None:
        if self.jitter_sigma < 0 or not 0 <= self.spike_probability <= 1:
            raise ValueError(f"bad noise model: {self}")
        if not 1 <= self.spike_min_factor <= self.spike_max_factor:
            raise ValueError(f"spike factors must satisfy 1 <= min <= max: {self}")

    @classmethod
    def exact(cls) -> NoiseModel:
        return cls(jitter_sigma=0.0, spike_probability=0.0)

    @classmethod
    def shared_cpu(cls) -> NoiseModel:
        """A CPU worker sharing its cores with a controller, a client and other tenants: fitted to live
        runs on a 2-core machine (jitter sigma 0.11-0.16, 3-7% of runs 1.5-4x their median;
        docs/benchmarks/cells-and-sim.md, "Live runs replayed in the simulator")."""
        return cls(jitter_sigma=0.15, spike_probability=0.05, spike_min_factor=1.5, spike_max_factor=3.5)

    @classmethod
    def named(cls, name: str) -> NoiseModel:
        """One of ``NOISE_MODELS``, by the name the command lines take."""
        if name not in _NAMED_NOISE:
            raise ValueError(f"unknown noise model {name!r}; choose from {', '.join(NOISE_MODELS)}")
        return _NAMED_NOISE[name]()

    def apply(self, duration_ns: int, rng: random.Random) -> int:
        factor = 1.0
        if self.jitter_sigma:
            factor = math.exp(rng.gauss(0.0, self.jitter_sigma))
        if self.spike_probability and rng.random() < self.spike_probability:
            factor *= rng.uniform(self.spike_min_factor, self.spike_max_factor)
        return max(1, round(duration_ns * factor))


_NAMED_NOISE: dict[str, Callable[[], NoiseModel]] = {
    "default": NoiseModel,
    "exact": NoiseModel.exact,
    "shared-cpu": NoiseModel.shared_cpu,
}
NOISE_MODELS = tuple(_NAMED_NOISE)  # ``NoiseModel.named``'s names, as the command lines take them


class _Lane:
    """One action at a time, ordered by ``earliest_ns``; refuses what misses its window."""

    def __init__(self, device: EmulatedDevice) -> None:
        self._device = device
        self._queue: list[tuple[int, int, Action]] = []
        self._running = False
        self._wake_ns: int | None = None

    def submit(self, action: Action, seq: int) -> None:
        heapq.heappush(self._queue, (action.earliest_ns, seq, action))
        self.poke()

    def poke(self) -> None:
        device = self._device
        timer = device.timer
        while not self._running and self._queue:
            now = timer.now_ns()
            earliest, _, action = self._queue[0]
            refusal = window_refusal(action, now, device.max_wait_ns)
            if refusal is not None:
                heapq.heappop(self._queue)
                device.emit(refusal)
            elif earliest > now:
                if self._wake_ns is None or earliest < self._wake_ns:
                    self._wake_ns = earliest
                    timer.call_at(earliest, self._on_wake)
                return
            else:
                heapq.heappop(self._queue)
                duration = device.start(action, now)
                if duration is not None:
                    self._running = True
                    timer.call_at(now + duration, partial(self._finish, action, now, now + duration))

    def _on_wake(self) -> None:
        if self._wake_ns is not None and self._wake_ns <= self._device.timer.now_ns():
            self._wake_ns = None
        self.poke()

    def _finish(self, action: Action, begin_ns: int, end_ns: int) -> None:
        self._running = False
        self._device.finish(action, Timing(begin_ns, end_ns))
        self.poke()


class EmulatedDevice:
    """One emulated accelerator: two lanes, a page pool, profile-driven durations."""

    def __init__(
        self,
        spec: DeviceSpec,
        profiles: Mapping[str, ModelProfile],
        timer: Timer,
        sink: ResultSink,
        noise: NoiseModel | None = None,
        seed: int = 0,
        max_wait_ns: int = 10 * NS_PER_S,
    ) -> None:
        self.spec = spec
        self.timer = timer
        self.max_wait_ns = max_wait_ns
        self._profiles = profiles
        self._sink = sink
        self._noise = noise if noise is not None else NoiseModel()
        self._rng = random.Random(seed)
        self.pool = PagePool(spec.pool_bytes, spec.page_bytes)
        self.peak_used_pages = 0
        self._resident: set[str] = set()
        self._exec_lane = _Lane(self)
        self._load_lane = _Lane(self)
        self._seq = 0

    @property
    def resident_models(self) -> frozenset[str]:
        return frozenset(self._resident)

    def drop(self, model: str) -> None:
        """``model`` is unregistered: its weights go (else a load after it is registered again is refused)."""
        self._resident.discard(model)
        if self.pool.holds(model):
            self.pool.release(model)

    def submit(self, action: Action) -> None:
        if action.device != self.spec.device:
            raise ValueError(f"action {action.action_id} is for device {action.device}, not {self.spec.device}")
        self._seq += 1
        lane = self._exec_lane if isinstance(action, Infer) else self._load_lane
        lane.submit(action, self._seq)

    def emit(self, result: ActionResult) -> None:
        self._sink(result)

    def start(self, action: Action, now_ns: int) -> int | None:
        """Begin an action; returns its duration, or None after emitting a refusal."""
        refusal = self._check(action)
        if refusal is not None:
            status, message = refusal
            self.emit(ActionResult(action.action_id, self.spec.device, status, message=message))
            return None
        profile = self._profiles[action.model]
        if isinstance(action, LoadWeights):
            self.pool.allocate(action.model, profile.pages(self.spec.page_bytes))
            self.peak_used_pages = max(self.peak_used_pages, self.pool.used_pages)
            return self._noise.apply(profile.load_ns, self._rng)
        if isinstance(action, EvictWeights):
            self._resident.discard(action.model)
            self.pool.release(action.model)
            return 1
        return self._noise.apply(profile.exec_time_ns(action.batch_size), self._rng)

    def _check(self, action: Action) -> tuple[ActionStatus, str] | None:
        profile = self._profiles.get(action.model)
        if profile is None:
            return ActionStatus.ERROR, f"unknown model {action.model!r}"
        if isinstance(action, Infer):
            if action.model not in self._resident and not profile.weightless:  # one without weights: always
                return ActionStatus.NOT_RESIDENT, f"{action.model} is not resident"
            if action.batch_size not in profile.exec_ns or len(action.request_ids) > action.batch_size:
                return ActionStatus.ERROR, f"unsupported batch size {action.batch_size} for {action.model}"
        elif isinstance(action, LoadWeights):
            if self.pool.holds(action.model):
                return ActionStatus.ERROR, f"{action.model} is already resident"
            if profile.pages(self.spec.page_bytes) > self.pool.free_pages:
                return ActionStatus.OUT_OF_MEMORY, f"{action.model} needs more than {self.pool.free_pages} free pages"
        elif not self.pool.holds(action.model):
            return ActionStatus.NOT_RESIDENT, f"{action.model} is not resident"
        return None

    def finish(self, action: Action, timing: Timing) -> None:
        if isinstance(action, LoadWeights):
            self._resident.add(action.model)
        outputs: list[object] | None = [None] * len(action.request_ids) if isinstance(action, Infer) else None
        self.emit(ActionResult(action.action_id, self.spec.device, ActionStatus.OK, timing, outputs=outputs))
