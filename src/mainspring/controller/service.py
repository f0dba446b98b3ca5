"""The live controller: a ``Controller`` on an asyncio loop, fed by workers and the frontend.

It is the only place that reads the wall clock or does I/O for the policy. Workers join
and leave (their devices are added to or removed from the policy), models are loaded and
unloaded through the repository API, and every client request is a future answered
exactly once: a result, an early rejection with the reason, or an error.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from mainspring.controller.controller import Controller, ControllerObserver, Observers
from mainspring.controller.overload import OverloadGuard
from mainspring.controller.workers import WorkerSet
from mainspring.frontend.port import Answer, ServedModel, ServiceError
from mainspring.models.profile import ModelProfile
from mainspring.protocol import ActionResult, DeviceSpec, Outcome, Request, Response
from mainspring.protocol.models import ModelInfo, ModelOperation, ModelReply, ModelTarget, served_name
from mainspring.protocol.requests import DEFAULT_DEADLINE_MARGIN_MS
from mainspring.protocol.tensors import Sample
from mainspring.scheduler.base import Membership
from mainspring.scheduler.registry import DEFAULT_POLICY, make_scheduler
from mainspring.telemetry.metrics import ModelStats, ServingMetrics
from mainspring.telemetry.recorder import LogWriter
from mainspring.telemetry.timeline import Timeline
from mainspring.time import NS_PER_S, Clock, WallClock
from mainspring.transport.links import WorkerHandle

log = logging.getLogger(__name__)


class ControllerService:
    def __init__(
        self,
        policy: str = DEFAULT_POLICY,
        default_slo_ms: float = 100.0,
        seed: int = 0,
        deadline_margin_ms: float = DEFAULT_DEADLINE_MARGIN_MS,
        watchdog_grace_s: float = 10.0,
        max_outstanding: int = 100_000,
        max_outstanding_bytes: int = 2 * 1024**3,
        log_dir: Path | None = None,
        max_loop_lag_ms: float | None = None,
        policy_settings: Mapping[str, object] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.clock = clock or WallClock()
        self.watchdog_grace_s = watchdog_grace_s  # beyond an action's window and twice its expected duration
        # Unanswered requests (samples) and their input bytes bound memory under any flood and policy; the
        # event loop's lag, the controller's CPU (by default half the default SLO: a loop that late leaves
        # requests little of their time).
        lag_ms = max_loop_lag_ms if max_loop_lag_ms is not None else default_slo_ms / 2
        self.guard = OverloadGuard(max_outstanding, max_outstanding_bytes, round(lag_ms * 1e6))
        self.policy_name = policy
        self.default_slo_ns = round(default_slo_ms * 1e6)
        margin_ns = round(deadline_margin_ms * 1e6)
        scheduler = make_scheduler(policy, {}, [], random.Random(seed), margin_ns, policy_settings, "policy settings")
        if not isinstance(scheduler, Membership):
            raise ValueError(f"policy {policy!r} cannot serve live: devices and models must be able to come and go")
        self._membership: Membership = scheduler
        self.metrics = ServingMetrics()
        # The simulator's request and action logs, for ``mainspring analyze``.
        self.logs = LogWriter(log_dir, f"live-{time.strftime('%Y%m%d-%H%M%S')}") if log_dir is not None else None
        self.timeline = Timeline()  # the live page's last seconds of every lane
        observers = (self.metrics, self.timeline) if self.logs is None else (self.metrics, self.timeline, self.logs)
        observer: ControllerObserver = Observers(*observers)
        self.connected = WorkerSet()
        self.controller = Controller(
            scheduler,
            self.clock,
            self.connected.links,
            self._answer,
            self._request_wakeup,
            observer,
            send_inputs=True,
            defer=self._soon,
        )
        self.models: dict[str, ServedModel] = {}
        self.load_errors: dict[str, str] = {}
        self._request_ids = itertools.count(1)
        self._futures: dict[int, asyncio.Future[Answer]] = {}
        self._open: collections.Counter[str] = collections.Counter()  # unanswered requests per model key
        self._unloading: set[str] = set()
        self._changing: dict[str, asyncio.Lock] = {}  # one load, reload or unload of a model at a time
        self._unloaded: set[str] = set()  # unloaded through the API: a worker that joins later must not serve them
        self._generations = itertools.count(2)  # of reloads in place: the internal names' suffixes
        self._loop: asyncio.AbstractEventLoop | None = None
        self.accepting = True
        # Told when models, devices or acceptance change (frontend processes keep a copy of that state).
        self.state_listeners: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._announcements: set[asyncio.Task[None]] = set()
        self.worker_joined = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    @property
    def policy(self) -> Membership:
        """The policy (read by a cell's load signal; the controller alone calls it)."""
        return self._membership

    @property
    def workers(self) -> list[WorkerHandle]:
        return self.connected.handles

    @property
    def device_count(self) -> int:
        return len(self.connected.links)

    @property
    def device_ids(self) -> list[int]:
        """The connected devices (the controller's ids)."""
        return sorted(self.connected.links)

    # --- clients ------------------------------------------------------------------------------
    async def infer(self, model: str, samples: Sequence[Sample], slo_ns: int | None = None) -> list[Answer]:
        """Submit one request per sample (all with the same deadline) and wait for every answer."""
        if not self.accepting:
            raise ServiceError("unavailable", "the server is shutting down")
        served = self.models.get(model)
        if served is None:
            raise ServiceError("not_found", f"unknown model {model!r}")
        if model in self._unloading:
            raise ServiceError("unavailable", f"model {model!r} is being unloaded")
        size = sum(int(array.nbytes) for sample in samples for array in sample.values()) // max(len(samples), 1)
        refusal = self.guard.refusal(len(samples), size)
        if refusal is not None:
            self.metrics.rejections.labels(Outcome.OVERLOADED.value).inc(len(samples))
            raise ServiceError("overloaded", f"overloaded: {refusal}")
        slo = slo_ns if slo_ns is not None else self.default_slo_ns
        now = self.clock.now_ns()
        futures = []
        for sample in samples:
            request = Request(next(self._request_ids), served.key, now, now + slo, slo, sample)
            future: asyncio.Future[Answer] = self.loop.create_future()
            self._futures[request.id] = future
            self._open[served.key] += 1
            self.guard.admit(request.id, size)
            futures.append(future)
            self.controller.submit(request)
        return list(await asyncio.gather(*futures))

    def _answer(self, request: Request, response: Response, output: object) -> None:
        future = self._futures.pop(request.id, None)
        if future is not None:
            self.guard.release(request.id)
            left = self._open[request.model] - 1
            if left > 0:
                self._open[request.model] = left
            else:
                del self._open[request.model]
            name = served_name(request.model)
            if name != request.model and request.model in response.reason:  # a reloaded model's internal name
                response = dataclasses.replace(response, reason=response.reason.replace(request.model, name))
            if not future.done():
                future.set_result((response, output))

    def _soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    def _request_wakeup(self, at_ns: int) -> None:
        self.loop.call_at(at_ns / NS_PER_S, self.controller.wake)

    # --- workers (WorkerEvents) -------------------------------------------------------------
    def on_join(
        self, handle: WorkerHandle, devices: list[DeviceSpec], models: list[ModelInfo], errors: dict[str, str]
    ) -> None:
        self.connected.join(handle)
        self.load_errors.update(errors)
        corrections = self._adopt(handle, models)
        if not corrections:
            self._add_devices(handle, devices)
            return
        task = self.loop.create_task(self._bring_in_line(handle, devices, corrections))
        self._announcements.add(task)
        task.add_done_callback(self._announcements.discard)

    def _adopt(self, handle: WorkerHandle, models: list[ModelInfo]) -> list[tuple[ModelOperation, ModelTarget]]:
        """Serve the joining worker's models that nothing here contradicts (the first worker's: all of them),
        under the names it holds them by; return what the worker must change to serve exactly what is served
        here, as it is served: a model at another version or config, one unloaded through the API, one a
        reload in place has retired, one it lacks."""
        corrections, matching = [], set()
        for info in models:
            key = info.config.name
            name = served_name(key)
            served = self.models.get(name)
            if served is None and name not in self._unloaded:  # under its key: a restarted controller's worker
                profile = ModelProfile.from_json(info.profile, f"worker {handle.name} model {key}")
                self._membership.add_model(profile)
                config = msgspec.structs.replace(info.config, name=name)
                self.models[name] = ServedModel(config, profile.renamed(name), info.version, key)
                matching.add(name)
            elif (
                served is not None
                and (served.key, served.version) == (key, info.version)
                and (served.config == msgspec.structs.replace(info.config, name=name))
            ):
                matching.add(name)
            else:
                corrections.append((ModelOperation.UNLOAD, ModelTarget(name, served_as=key)))
        for name, served in self.models.items():
            if name not in matching:
                target = ModelTarget(name, served.version, "" if served.key == name else served.key)
                corrections.append((ModelOperation.LOAD, target))
        return corrections

    async def _bring_in_line(
        self, handle: WorkerHandle, devices: list[DeviceSpec], corrections: list[tuple[ModelOperation, ModelTarget]]
    ) -> None:
        """Apply ``corrections`` on the joining worker, then plan on its devices (weights it held of a model
        it was told to change are not adopted: unloading freed them)."""
        changed = set()
        for op, target in corrections:
            changed.add(target.key)
            try:
                replies = await self._model_op(op, target, 120.0, handles=[handle])
            except ServiceError as error:
                replies = [ModelReply(0, target.key, error=str(error))]
            for reply in replies:
                if reply.error:
                    log.error("worker %s: %s of %s failed, so its devices will fail that model's actions: %s",
                              handle.name, op.value, target.key, reply.error)  # fmt: skip
            log.info("worker %s: %s of %s done, to serve what is served here", handle.name, op.value, target.key)
        if handle in self.connected:  # not lost meanwhile
            kept = [
                msgspec.structs.replace(d, resident=tuple(m for m in d.resident if m not in changed)) for d in devices
            ]
            self._add_devices(handle, kept)

    def _add_devices(self, handle: WorkerHandle, devices: list[DeviceSpec]) -> None:
        for spec in self.connected.add_devices(handle, devices):
            self._membership.add_device(spec)
        self._update_gauges()
        self._announce_soon()
        held = sum(len(spec.resident) for spec in devices)
        log.info("worker %s joined: %d device(s) already holding %d model(s); models %s",
                 handle.name, len(devices), held, sorted(self.models))  # fmt: skip
        self.worker_joined.set()
        if self._watchdog is None:
            self._watchdog = self.loop.create_task(self._watch_actions())
        self.guard.watch(self.loop)
        self.controller.pump()

    async def _watch_actions(self, period_s: float = 0.25) -> None:
        """A worker whose action never reports (a lane hung inside a live process, which still answers
        heartbeats) is dropped as lost: its requests are requeued where they can still make it and
        answered otherwise, and it is told to start over (``mainspring worker`` does, and
        ``mainspring serve`` restarts a local one that exits)."""
        grace_ns = round(self.watchdog_grace_s * NS_PER_S)
        while True:
            await asyncio.sleep(period_s)
            now = self.clock.now_ns()
            for handle, device, action in list(self.connected.hung(self.controller, now, grace_ns)):
                if handle not in self.connected:
                    continue  # dropped for another of its devices
                late_s = (now - action.latest_ns - action.expected_duration_ns) / NS_PER_S
                log.error("worker %s: %s action %d on device %d has not reported %.1f s after it was due; "
                          "dropping the worker", handle.name, type(action).__name__, action.action_id,
                          device, late_s)  # fmt: skip
                self.metrics.hung_actions.inc()
                handle.close(f"action {action.action_id} did not report in time: start over", start_over=True)
                self.on_lost(handle)

    def on_result(self, handle: WorkerHandle, result: ActionResult) -> None:
        global_id = self.connected.global_id(handle, result.device)
        if global_id is None:
            return  # from a device already declared lost
        self.controller.deliver(msgspec.structs.replace(result, device=global_id))

    def on_lost(self, handle: WorkerHandle) -> None:
        for global_id in self.connected.remove(handle):
            self.controller.remove_device(global_id)
        self._update_gauges()
        self._announce_soon()
        log.warning("worker %s lost; %d device(s) left", handle.name, self.device_count)

    def on_model_reply(self, handle: WorkerHandle, reply: ModelReply) -> None:
        self.connected.reply(handle, reply)

    def _update_gauges(self) -> None:
        self.metrics.workers.set(len(self.connected))
        self.metrics.devices.set(self.device_count)
        self.metrics.models.set(len(self.models))

    def _announce_soon(self) -> None:
        """Tell the listeners of a change made where nothing can wait for them (a worker joining or lost)."""
        for listener in self.state_listeners:
            task = self.loop.create_task(listener())
            self._announcements.add(task)
            task.add_done_callback(self._announcements.discard)

    async def _announce(self) -> None:
        """Tell the listeners now: they know before the caller of a load, unload or drain hears it is done."""
        for listener in self.state_listeners:
            await listener()

    async def warm(self, model: str) -> bool:
        """Load a served model's weights onto a device before its requests come (a cell taking a model
        over from another); False when the policy cannot (held already, or a policy without warming)."""
        served = self.models.get(model)
        if served is None:
            raise ServiceError("not_found", f"unknown model {model!r}")
        warm = getattr(self._membership, "warm", None)
        if warm is None or not warm(served.key):
            return False
        self.controller.pump()
        return True

    # --- what a frontend reads besides inference (``frontend/port.py``) --------------------------
    async def refresh(self) -> bool:
        return False  # this is the controller: its view is the current one

    async def model_statistics(self, model: str) -> ModelStats:
        return self.metrics.stats(model)

    async def exposition(self) -> bytes:
        """The Prometheus metrics, in the text format."""
        self.metrics.loop_lag.set(self.guard.loop_lag_ns / NS_PER_S)
        return self.metrics.exposition(self.clock.now_ns())

    def count_dropped_client(self, transport: str, cause: str, frontend: str = "main", count: int = 1) -> None:
        self.metrics.client_disconnects.labels(frontend, transport, cause).inc(count)

    async def timeline_view(self, seconds: float) -> dict[str, Any]:
        """The live page's data: every device's lanes over the last ``seconds``."""
        return self.timeline.snapshot(self.clock.now_ns(), seconds, self.device_ids)

    # --- repository ---------------------------------------------------------------------------
    async def load_model(self, model: str, timeout_s: float = 120.0) -> None:
        async with self._change(model, "load"):
            if model not in self.models:  # served already, or once a change this one waited for finished
                self.models[model] = await self._load_everywhere(ModelTarget(model), timeout_s)
                self._unloaded.discard(model)
                self._update_gauges()
                await self._announce()

    async def reload_model(self, model: str, timeout_s: float = 120.0) -> None:
        """Serve the repository's entry for ``model`` anew without refusing a request (Triton's load of a
        loaded model): load it beside the one served, under an internal name; send new requests there;
        let those admitted finish on the old; then unload the old. A load that fails leaves the old served."""
        async with self._change(model, "reload"):
            old = self.models.get(model)
            if old is None:
                raise ServiceError("not_found", f"model {model!r} is not loaded")
            key = old.key
            while key == old.key:  # a key adopted from a worker may have any suffix
                key = f"{model}@{next(self._generations)}"
            target = ModelTarget(model, served_as=key)
            begin = time.monotonic()
            self.models[model] = new = await self._load_everywhere(target, timeout_s, keep_reason=False)
            await self._announce()
            loaded = time.monotonic()
            await self._drain(old.key, timeout_s)
            await self._retire(old.key, timeout_s)
            retired = time.monotonic()
            log.info("%s: version %d serves as %s after %.2f s; version %d (%s) retired %.2f s later", model,
                     new.version, key, loaded - begin, old.version, old.key, retired - loaded)  # fmt: skip

    async def unload_model(self, model: str, timeout_s: float = 60.0) -> None:
        """Refuse new requests for ``model``, let the admitted ones finish (each is answered by its
        deadline at the latest, so ``timeout_s`` only bounds a bug), then unload it everywhere."""
        async with self._change(model, "unload"):
            served = self.models.get(model)
            if served is None:
                raise ServiceError("not_found", f"model {model!r} is not loaded")
            self._unloading.add(model)
            try:
                await self._drain(served.key, timeout_s)
            finally:
                self._unloading.discard(model)
            del self.models[model]
            self._unloaded.add(model)
            self._update_gauges()
            await self._retire(served.key, timeout_s)

    @contextlib.asynccontextmanager
    async def _change(self, model: str, change: str) -> AsyncIterator[None]:
        """One load, reload or unload of ``model`` at a time: another waits its turn (each is bounded by
        its timeout), then sees what the one before did. Counted by result, a load of a served model apart."""
        async with self._changing.setdefault(model, asyncio.Lock()):  # kept: one per model name ever changed
            served_before = model in self.models
            try:
                yield
            except ServiceError as error:
                if error.kind != "not_found":  # a change asked of a model not served is refused, not failed
                    self.metrics.model_changes.labels(model, change, "failed").inc()
                raise
            if change != "load" or not served_before:
                self.metrics.model_changes.labels(model, change, "done").inc()

    async def _load_everywhere(self, target: ModelTarget, timeout_s: float, keep_reason: bool = True) -> ServedModel:
        """Load ``target`` on every worker and into the policy; on a failure anywhere, nowhere (the reason
        stays in the repository index when ``keep_reason``: the model is not served)."""
        model = target.model
        if not self.connected:
            raise ServiceError("unavailable", "no worker is connected")
        try:
            replies = await self._model_op(ModelOperation.LOAD, target, timeout_s)
        except ServiceError:  # a worker did not answer in time: the others must not keep what they loaded
            with contextlib.suppress(ServiceError):
                await self._model_op(ModelOperation.UNLOAD, target, timeout_s)
            raise
        failed = [r for r in replies if r.error]
        if failed or not replies:
            if len(failed) < len(replies):
                await self._model_op(ModelOperation.UNLOAD, target, timeout_s)  # keep the workers consistent
            reason = failed[0].error if failed else f"no worker answered for {model!r}"
            if keep_reason:
                self.load_errors[model] = reason  # the repository index tells why the model is not served
                await self._announce()
            raise ServiceError("invalid", reason)
        info = replies[0].info
        assert info is not None
        profile = ModelProfile.from_json(info.profile, f"model {target.key}")
        self._membership.add_model(profile)
        self.load_errors.pop(model, None)
        config = msgspec.structs.replace(info.config, name=model)  # clients see the model's own name
        return ServedModel(config, profile.renamed(model), info.version, target.key)

    async def _drain(self, key: str, timeout_s: float) -> None:
        """Wait until the requests admitted for ``key`` are answered (by their deadlines), at most ``timeout_s``."""
        deadline = self.clock.now_ns() + round(timeout_s * NS_PER_S)
        while self._open[key] and self.clock.now_ns() < deadline:
            await asyncio.sleep(0.005)

    async def _retire(self, key: str, timeout_s: float) -> None:
        """Take ``key`` out of the policy (answering what it still queues) and off every worker."""
        self._membership.remove_model(key, self.clock.now_ns())
        self.controller.pump()  # hand out the answers of its queued requests
        await self._announce()
        await self._model_op(ModelOperation.UNLOAD, ModelTarget(served_name(key), served_as=key), timeout_s)

    async def _model_op(
        self, op: ModelOperation, target: ModelTarget, timeout_s: float, handles: Sequence[WorkerHandle] = ()
    ) -> list[ModelReply]:
        """``op`` on ``handles`` (default: every worker); their replies."""
        return await self.connected.model_op(op, target, timeout_s, handles)

    # --- shutdown -----------------------------------------------------------------------------
    async def drain(self, timeout_s: float) -> int:
        """Stop accepting; wait up to ``timeout_s`` for outstanding requests, then answer the rest with an error."""
        self.accepting = False
        await self._announce()
        if self._watchdog is not None:
            self._watchdog.cancel()
        deadline = self.clock.now_ns() + round(timeout_s * NS_PER_S)
        while self.controller.outstanding and self.clock.now_ns() < deadline:
            await asyncio.sleep(0.01)
        self.guard.stop()  # after the drain: its tick carries a cell's signal, which says the cell still lives
        left = self.controller.shutdown("the server is shutting down")
        for handle in self.connected.handles:
            handle.close("controller shutting down")
        if self.logs is not None:
            self.logs.close()
        return left
