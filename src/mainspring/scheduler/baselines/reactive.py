"""Shared mechanics of the reactive baselines (Triton-like, Clipper-like).

No prediction: one batch in flight per device, FIFO per model, a model loaded on
demand when a request for it arrives, least-recently-used models evicted when
memory is short. Subclasses decide the batch size.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mainspring.models.profile import ModelProfile
from mainspring.protocol import (
    Action,
    ActionResult,
    ActionStatus,
    DeviceSpec,
    EvictWeights,
    Infer,
    LoadWeights,
    Outcome,
    Request,
    Response,
)
from mainspring.protocol.model_names import client_name
from mainspring.scheduler.base import Decisions
from mainspring.scheduler.common import PolicyBookkeeping
from mainspring.time import NS_PER_S, ms_to_ns

# Reactive policies set no real window: a worker may start their actions whenever.
OPEN_WINDOW_NS = 3600 * NS_PER_S


@dataclass(frozen=True)
class ReactiveConfig:
    """``max_queue_delay_ms``: how long a partial batch may wait for more requests.
    ``queue_timeout_ms``: drop a request that waited this long (None: never)."""

    max_batch_size: int = 16
    max_queue_delay_ms: float = 2.0
    queue_timeout_ms: float | None = None

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_queue_delay_ms < 0:
            raise ValueError(f"bad batching settings: {self}")
        if self.queue_timeout_ms is not None and self.queue_timeout_ms <= 0:
            raise ValueError(f"queue_timeout_ms must be positive, got {self.queue_timeout_ms}")


@dataclass
class _Device:
    spec: DeviceSpec
    free_pages: int
    resident: OrderedDict[str, int] = field(default_factory=OrderedDict)  # model -> last use, LRU first
    loading: set[str] = field(default_factory=set)
    running: str | None = None  # model of the batch in flight on the exec lane


class ReactiveScheduler(PolicyBookkeeping):
    """Base of the baselines; subclasses override ``batch_limit`` and ``on_batch_done``."""

    def __init__(
        self, profiles: Mapping[str, ModelProfile], devices: Sequence[DeviceSpec], config: ReactiveConfig
    ) -> None:
        super().__init__(profiles)
        self._config = config
        self._devices = {d.device: _Device(d, d.total_pages) for d in devices}
        self._queues: dict[str, deque[Request]] = {}
        self._placement: dict[str, int] = {}
        self._in_flight: dict[int, Action] = {}
        self._stale: set[int] = set()  # in-flight actions of a model unloaded since (maybe added again)
        self._batches: dict[int, list[Request]] = {}
        self._delay_ns = ms_to_ns(config.max_queue_delay_ms)
        self._timeout_ns = None if config.queue_timeout_ms is None else ms_to_ns(config.queue_timeout_ms)
        self._hold_weightless()

    # --- hooks for subclasses -------------------------------------------------
    def batch_limit(self, model: str) -> int:
        return min(self._config.max_batch_size, self.profiles[model].max_batch)

    def on_batch_done(self, model: str, requests: Sequence[Request], duration_ns: int) -> None:
        """Called after every successful batch."""

    # --- the contract ----------------------------------------------------------
    def on_request(self, request: Request, now_ns: int) -> None:
        if not self._refuse_unservable(request, (d.spec for d in self._devices.values())):
            self._queues.setdefault(request.model, deque()).append(request)

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        action = self._in_flight.pop(result.action_id)
        device = self._devices[action.device]
        if action.action_id in self._stale:  # unloaded meanwhile; its requests were answered then
            self._stale.discard(action.action_id)
            self._batches.pop(action.action_id, None)
            if isinstance(action, Infer):
                device.running = None
            return
        if isinstance(action, Infer):
            self._infer_done(action, result, device, now_ns)
        elif isinstance(action, LoadWeights):
            device.loading.discard(action.model)
            if result.ok:
                device.resident[action.model] = now_ns
            else:
                device.free_pages += self.pages_of(action.model, device.spec)
                del self._placement[action.model]
                if result.status is ActionStatus.ERROR:
                    for request in self._queues.pop(action.model, ()):
                        self._answer(request, Outcome.LOAD_FAILED, f"loading failed: {result.message}")

    def schedule(self, now_ns: int) -> Decisions:
        decisions = Decisions(responses=self._take_responses())
        if self._timeout_ns is not None:
            self._expire(now_ns, decisions)
        for model in list(self._queues):
            if model not in self._placement:
                self._place(model, now_ns, decisions)
        waiting_by_device: dict[int, list[str]] = {}
        for model in self._queues:
            device_id = self._placement.get(model)
            if device_id is not None and model in self._devices[device_id].resident:
                waiting_by_device.setdefault(device_id, []).append(model)
        wakeups = [
            self._dispatch(self._devices[device_id], models, now_ns, decisions)
            for device_id, models in waiting_by_device.items()
        ]
        if self._timeout_ns is not None:
            wakeups += [q[0].arrival_ns + self._timeout_ns for q in self._queues.values()]
        pending = [w for w in wakeups if w is not None]
        decisions.wakeup_ns = min(pending) if pending else None
        return decisions

    # --- membership (scheduler.base.Membership) ---------------------------------
    def add_device(self, spec: DeviceSpec) -> None:
        if spec.device in self._devices:
            raise ValueError(f"device {spec.device} is already known")
        device = self._devices[spec.device] = _Device(spec, spec.total_pages)
        for model, pages in self.adoptable(spec):
            # One placement per model: a copy on a second device is kept (its pages are taken) but
            # unused until evicted.
            device.resident[model] = -1
            device.free_pages -= pages
            self._placement.setdefault(model, spec.device)

    def _hold_everywhere(self, model: str) -> None:
        for device in self._devices.values():
            device.resident[model] = -1
            self._placement.setdefault(model, device.spec.device)

    def remove_device(self, device: int, now_ns: int) -> None:
        gone = self._devices.pop(device)
        for model in [*gone.resident, *gone.loading]:
            if self._placement.get(model) == device:
                del self._placement[model]
        for action_id, action in list(self._in_flight.items()):
            if action.device != device:
                continue
            del self._in_flight[action_id]
            self._stale.discard(action_id)
            for request in self._batches.pop(action_id, []):
                if self._devices:
                    self._queues.setdefault(request.model, deque()).appendleft(request)
                else:
                    self._answer(request, Outcome.NO_WORKER, "no worker is connected")
        if not self._devices:
            for queue in self._queues.values():
                for request in queue:
                    self._answer(request, Outcome.NO_WORKER, "no worker is connected")
            self._queues.clear()

    def remove_model(self, model: str, now_ns: int) -> None:
        reason = f"model {client_name(model)!r} was unloaded"
        for request in self._queues.pop(model, ()):
            self._answer(request, Outcome.MODEL_UNLOADED, reason)
        for action_id, action in self._in_flight.items():
            if action.model == model:
                self._stale.add(action_id)
                for request in self._batches.get(action_id, []):
                    self._answer(request, Outcome.MODEL_UNLOADED, reason)
                self._batches[action_id] = []
        self._placement.pop(model, None)
        for device in self._devices.values():  # every copy: one adopted from a rejoining worker too
            if model in device.resident or model in device.loading:
                device.resident.pop(model, None)
                device.loading.discard(model)
                device.free_pages += self.pages_of(model, device.spec)
        self._forget_model(model)

    # --- steps -----------------------------------------------------------------
    def _expire(self, now_ns: int, decisions: Decisions) -> None:
        assert self._timeout_ns is not None
        for model in list(self._queues):
            queue = self._queues[model]
            while queue and now_ns - queue[0].arrival_ns >= self._timeout_ns:
                request = queue.popleft()
                decisions.responses.append(Response(request.id, Outcome.QUEUE_TIMEOUT, "queue timeout"))
            if not queue:
                del self._queues[model]

    def _place(self, model: str, now_ns: int, decisions: Decisions) -> None:
        """Load ``model`` on the device with the most free memory, evicting LRU idle models if needed;
        a copy already held (adopted from a rejoining worker, kept when its placement's device left)
        is used instead: loading it again would count its pages twice, and the memory that leaks
        could leave a later model unplaceable, its requests never answered."""
        held = [d for d in self._devices.values() if model in d.resident]
        if held:
            self._placement[model] = max(held, key=lambda d: (d.resident[model], -d.spec.device)).spec.device
            return
        best: tuple[tuple[int, int], _Device, list[str]] | None = None
        for device in self._devices.values():
            need = self.pages_of(model, device.spec)
            victims = self._victims(device, need)
            if victims is None:
                continue
            oldest_victim_use = device.resident[victims[0]] if victims else -1
            key = (0, -device.free_pages) if not victims else (1, oldest_victim_use)
            if best is None or key < best[0]:
                best = (key, device, victims)
        if best is None:
            return  # nothing evictable now; retried on the next pass
        _, device, victims = best
        for victim in victims:
            del device.resident[victim]
            if self._placement.get(victim) == device.spec.device:
                del self._placement[victim]
            device.free_pages += self.pages_of(victim, device.spec)
            decisions.actions.append(self._action(EvictWeights, device, victim, now_ns, 0))
        device.free_pages -= self.pages_of(model, device.spec)
        device.loading.add(model)
        self._placement[model] = device.spec.device
        decisions.actions.append(self._action(LoadWeights, device, model, now_ns, self.profiles[model].load_ns))

    def _victims(self, device: _Device, need: int) -> list[str] | None:
        """LRU resident models with no queued work that free ``need`` pages; None if impossible."""
        freed = device.free_pages
        victims = []
        for model in device.resident:
            if freed >= need:
                break
            if model in self._queues or model == device.running or not self.evictable(model):
                continue
            victims.append(model)
            freed += self.pages_of(model, device.spec)
        return victims if freed >= need else None

    def _dispatch(self, device: _Device, waiting: list[str], now_ns: int, decisions: Decisions) -> int | None:
        """Start the oldest ready batch on an idle device; returns when a partial batch becomes ready."""
        if device.running is not None:
            return None
        chosen, wakeup = None, None
        for model in waiting:
            queue = self._queues[model]
            ready_at = queue[0].arrival_ns + self._delay_ns
            if len(queue) < self.batch_limit(model) and ready_at > now_ns:
                wakeup = ready_at if wakeup is None else min(wakeup, ready_at)
            elif chosen is None or queue[0].arrival_ns < self._queues[chosen][0].arrival_ns:
                chosen = model
        if chosen is None:
            return wakeup
        queue = self._queues[chosen]
        batch = [queue.popleft() for _ in range(min(len(queue), self.batch_limit(chosen)))]
        if not queue:
            del self._queues[chosen]
        profile = self.profiles[chosen]
        size = profile.padded_batch(len(batch))
        infer = Infer(
            self._new_action_id(), device.spec.device, chosen, now_ns, now_ns + OPEN_WINDOW_NS,
            profile.exec_ns[size], tuple(r.id for r in batch), size, tuple(r.ready_by_ns for r in batch),
        )  # fmt: skip
        self._in_flight[infer.action_id] = infer
        self._batches[infer.action_id] = batch
        device.running = chosen
        device.resident[chosen] = now_ns
        device.resident.move_to_end(chosen)
        decisions.actions.append(infer)
        return None

    def _infer_done(self, action: Infer, result: ActionResult, device: _Device, now_ns: int) -> None:
        device.running = None
        batch = self._batches.pop(action.action_id)
        if result.ok:
            assert result.timing is not None
            self._answer_served(batch, result, action.action_id)
            self.on_batch_done(action.model, batch, result.timing.duration_ns)
        elif result.status is ActionStatus.ERROR:
            for request in batch:
                self._answer(request, Outcome.INFERENCE_FAILED, f"inference failed: {result.message}")
        else:  # refused: try again, oldest first
            self._queues.setdefault(action.model, deque()).extendleft(reversed(batch))

    def _action(
        self, kind: type[LoadWeights] | type[EvictWeights], device: _Device, model: str, now_ns: int, expected_ns: int
    ) -> LoadWeights | EvictWeights:
        action = kind(self._new_action_id(), device.spec.device, model, now_ns, now_ns + OPEN_WINDOW_NS, expected_ns)
        self._in_flight[action.action_id] = action
        return action
