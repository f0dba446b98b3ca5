"""The live controller: a ``Controller`` on an asyncio loop, fed by workers and the frontend.

It is the only place that reads the wall clock or does I/O for the policy. Workers join
and leave (their devices are added to or removed from the policy), models are loaded and
unloaded through the repository API, and every client request is a future answered
exactly once: a result, an early rejection with the reason, or an error.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import random
import time
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from mainspring.controller.controller import Controller, ControllerObserver, Observers, UnknownActionError
from mainspring.controller.lifecycle import ModelLifecycle
from mainspring.controller.overload import ServerLoadLimits
from mainspring.controller.rejoin import RejoinBackoff
from mainspring.controller.workers import WorkerSet, announced_only
from mainspring.frontend.port import Answer, ServedModel, ServiceError
from mainspring.frontend.shedding import SHED
from mainspring.protocol import ActionResult, DeviceSpec, Outcome, Request, Response
from mainspring.protocol.models import ModelInfo, ModelOperation, ModelReply, ModelTarget, served_name
from mainspring.protocol.requests import DEFAULT_DEADLINE_MARGIN_MS
from mainspring.protocol.tensors import Sample, TensorSpec
from mainspring.scheduler.base import Membership, Warms
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
        self.load_limits = ServerLoadLimits(max_outstanding, max_outstanding_bytes, round(lag_ms * 1e6))
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
        self.rejoin = RejoinBackoff()  # for workers dropped for misbehaving
        # Models a worker may announce (the names of the repository the local workers serve); None: any.
        self.known_models: Callable[[], Collection[str]] | None = None
        self._output_specs: dict[str, tuple[TensorSpec, ...]] = {}  # by model key: what results are checked by
        self.controller = Controller(
            scheduler,
            self.clock,
            self.connected.links,
            self._answer,
            self._request_wakeup,
            observer,
            send_inputs=True,
            defer=self._soon,
            output_specs=self._output_specs.get,
        )
        self._request_ids = itertools.count(1)
        self._futures: dict[int, asyncio.Future[Answer]] = {}
        self._open: collections.Counter[str] = collections.Counter()  # unanswered requests per model key
        self.lifecycle = ModelLifecycle(self)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.accepting = True
        self.in_line = True  # a cell restarted (or started) is not, until the server says (``CellsPort``)
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
    def models(self) -> dict[str, ServedModel]:
        """The served models by the name clients use (``ModelLifecycle``)."""
        return self.lifecycle.models

    @property
    def load_errors(self) -> dict[str, str]:
        """Why a model of the repository is not served, by name."""
        return self.lifecycle.load_errors

    def open_count(self, key: str) -> int:
        """Requests admitted for model ``key`` and not answered yet."""
        return self._open[key]

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
    def pool_bytes(self) -> int:
        """The connected devices' weight pools together (a cell's capacity in the cells' plan)."""
        return sum(spec.total_pages * spec.page_bytes for spec in self.connected.specs.values())

    @property
    def device_ids(self) -> list[int]:
        """The connected devices (the controller's ids)."""
        return sorted(self.connected.links)

    # --- clients ------------------------------------------------------------------------------
    async def infer(
        self, model: str, samples: Sequence[Sample], slo_ns: int | None = None, waited_ns: int = 0
    ) -> list[Answer]:
        """Submit one request per sample (all with the same deadline, from when the call's first byte was read:
        ``waited_ns`` ago) and wait for every answer."""
        if not self.accepting:
            raise ServiceError("unavailable", "the server is shutting down")
        served = self.models.get(model)
        if served is None:
            raise ServiceError("not_found", f"unknown model {model!r}")
        if model in self.lifecycle.unloading:
            raise ServiceError("unavailable", f"model {model!r} is being unloaded")
        size = sum(int(array.nbytes) for sample in samples for array in sample.values()) // max(len(samples), 1)
        refusal = self.load_limits.refusal(len(samples), size)
        if refusal is not None:
            self.metrics.rejections.labels(Outcome.OVERLOADED.value).inc(len(samples))
            raise ServiceError("overloaded", f"overloaded: {refusal}")
        slo = slo_ns if slo_ns is not None else self.default_slo_ns
        self._output_specs[served.key] = served.config.outputs  # what its results must hold
        arrival = self.clock.now_ns() - max(0, waited_ns)
        futures = []
        for sample in samples:
            request = Request(next(self._request_ids), served.key, arrival, arrival + slo, slo, sample)
            future: asyncio.Future[Answer] = self.loop.create_future()
            self._futures[request.id] = future
            self._open[served.key] += 1
            self.load_limits.admit(request.id, size)
            futures.append(future)
            self.controller.submit(request)
        return list(await asyncio.gather(*futures))

    def _answer(self, request: Request, response: Response, output: object) -> None:
        future = self._futures.pop(request.id, None)
        if future is not None:
            self.load_limits.release(request.id)
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
        if self.known_models is not None:  # a worker may announce only the repository's models
            models, devices, errors = announced_only(handle.name, self.known_models(), models, devices, errors)
        self.connected.join(handle)
        self.load_errors.update(errors)
        corrections = self.lifecycle.adopt(handle, models)
        if not corrections:
            self._add_devices(handle, devices)
            return
        task = self.loop.create_task(self._bring_in_line(handle, devices, corrections))
        self._announcements.add(task)
        task.add_done_callback(self._announcements.discard)

    async def _bring_in_line(
        self, handle: WorkerHandle, devices: list[DeviceSpec], corrections: list[tuple[ModelOperation, ModelTarget]]
    ) -> None:
        kept = await self.lifecycle.bring_in_line(handle, devices, corrections)
        if kept is not None:
            self._add_devices(handle, kept)

    def _add_devices(self, handle: WorkerHandle, devices: list[DeviceSpec]) -> None:
        for spec in self.connected.add_devices(handle, devices):
            self._membership.add_device(spec)
        self.update_gauges()
        self._announce_soon()
        held = sum(len(spec.resident) for spec in devices)
        log.info("worker %s joined: %d device(s) already holding %d model(s); models %s",
                 handle.name, len(devices), held, sorted(self.models))  # fmt: skip
        self.worker_joined.set()
        if self._watchdog is None:
            self._watchdog = self.loop.create_task(self._watch_actions())
        self.load_limits.watch(self.loop)
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
                self.metrics.hung_actions.inc()
                self.drop(handle, "hung", f"{type(action).__name__} action {action.action_id} on device "
                                          f"{device} has not reported {late_s:.1f} s after it was due")  # fmt: skip

    def drop(self, handle: WorkerHandle, cause: str, why: str) -> None:
        """Drop a misbehaving worker (``cause``: hung, bad_result or bad_message) as lost: its requests
        are requeued where they can still make it and answered otherwise; it is told to start over
        (``mainspring worker`` does, and ``mainspring serve`` restarts a local one that exits) and may
        join again only after a backoff that grows with each drop (``RejoinBackoff``)."""
        if handle not in self.connected:
            return
        backoff_s = self.rejoin.dropped(handle.name)
        self.metrics.workers_dropped.labels(cause).inc()
        self.metrics.rejoin_backoff.set(backoff_s)
        log.error("worker %s: %s; dropping the worker (it may rejoin in %.0f s)", handle.name, why, backoff_s)
        handle.close(f"dropped: {why}: start over", start_over=True)
        self.on_lost(handle)

    def rejoin_wait_s(self, name: str) -> float:
        wait_s, first = self.rejoin.wait_s(name)
        if wait_s > 0:
            self.metrics.rejoins_deferred.inc()
            if first:
                log.warning("worker %s says hello %.1f s before its rejoin backoff ends: not answered until then",
                            name, wait_s)  # fmt: skip
        return wait_s

    def on_bad_message(self, handle: WorkerHandle, problem: str) -> None:
        self.drop(handle, "bad_message", f"sent a message that is not the protocol ({problem})")

    def on_result(self, handle: WorkerHandle, result: ActionResult) -> None:
        global_id = self.connected.global_id(handle, result.device)
        if global_id is None:
            return  # from a device already declared lost
        try:
            problem = self.controller.deliver_checked(
                msgspec.structs.replace(result, device=global_id), f"worker {handle.name}"
            )
        except UnknownActionError as error:
            problem = str(error)
        if problem is not None:
            self.drop(handle, "bad_result", f"sent a malformed result ({problem})")

    def on_lost(self, handle: WorkerHandle) -> None:
        for global_id in self.connected.remove(handle):
            self.controller.remove_device(global_id)
        self.update_gauges()
        self._announce_soon()
        log.warning("worker %s lost; %d device(s) left", handle.name, self.device_count)

    def on_model_reply(self, handle: WorkerHandle, reply: ModelReply) -> None:
        self.connected.reply(handle, reply)

    def update_gauges(self) -> None:
        self.metrics.workers.set(len(self.connected))
        self.metrics.devices.set(self.device_count)
        self.metrics.models.set(len(self.models))

    def _announce_soon(self) -> None:
        """Tell the listeners of a change made where nothing can wait for them (a worker joining or lost)."""
        for listener in self.state_listeners:
            task = self.loop.create_task(listener())
            self._announcements.add(task)
            task.add_done_callback(self._announcements.discard)

    async def announce(self) -> None:
        """Tell the listeners now: they know before the caller of a load, unload or drain hears it is done."""
        for listener in self.state_listeners:
            await listener()

    async def warm(self, model: str) -> bool:
        """Load a served model's weights onto a device before its requests come (a cell taking a model
        over from another); False when the policy cannot (held already, or a policy without warming)."""
        served = self.models.get(model)
        if served is None:
            raise ServiceError("not_found", f"unknown model {model!r}")
        if not isinstance(self._membership, Warms) or not self._membership.warm(served.key):
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
        self.metrics.loop_lag.set(self.load_limits.loop_lag_ns / NS_PER_S)
        return self.metrics.exposition(self.clock.now_ns())

    def count_dropped_client(self, transport: str, cause: str, frontend: str = "main", count: int = 1) -> None:
        if cause == SHED:  # refused at arrival, before the call was read: a rejection, not a client gone
            self.metrics.rejections.labels(Outcome.OVERLOADED.value).inc(count)
        else:
            self.metrics.client_disconnects.labels(frontend, transport, cause).inc(count)

    async def timeline_view(self, seconds: float) -> dict[str, Any]:
        """The live page's data: every device's lanes over the last ``seconds``."""
        return self.timeline.snapshot(self.clock.now_ns(), seconds, self.device_ids)

    # --- repository ---------------------------------------------------------------------------
    async def load_model(self, model: str, timeout_s: float = 120.0) -> None:
        await self.lifecycle.load(model, timeout_s)

    async def reload_model(self, model: str, timeout_s: float = 120.0) -> None:
        """Serve the repository's changed entry for a served model without refusing its requests meanwhile."""
        await self.lifecycle.reload(model, timeout_s)

    async def unload_model(self, model: str, timeout_s: float = 60.0) -> None:
        await self.lifecycle.unload(model, timeout_s)

    # --- shutdown -----------------------------------------------------------------------------
    async def drain(self, timeout_s: float) -> int:
        """Stop accepting; wait up to ``timeout_s`` for outstanding requests, then answer the rest with an error."""
        self.accepting = False
        await self.announce()
        if self._watchdog is not None:
            self._watchdog.cancel()
        deadline = self.clock.now_ns() + round(timeout_s * NS_PER_S)
        while self.controller.outstanding and self.clock.now_ns() < deadline:
            await asyncio.sleep(0.01)
        self.load_limits.stop()
        left = self.controller.shutdown("the server is shutting down")
        for handle in self.connected.handles:
            handle.close("controller shutting down")
        if self.logs is not None:
            self.logs.close()
        return left
