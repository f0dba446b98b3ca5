"""The live controller's side of its workers (``WorkerEvents``, what a transport reports): a joining worker
brought in line with what is served and its devices handed to the policy; results checked and delivered;
a lost worker's devices taken away; and a misbehaving worker dropped (an action that never reports, a
malformed result or message), with a backoff before it may join again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Protocol

import msgspec

from mainspring.controller.controller import Controller, UnknownActionError
from mainspring.controller.lifecycle import ModelLifecycle
from mainspring.controller.overload import ServerLoadLimits
from mainspring.controller.rejoin import RejoinBackoff
from mainspring.controller.workers import WorkerSet, announced_only
from mainspring.protocol import ActionResult, DeviceSpec
from mainspring.protocol.models import ModelInfo, ModelOperation, ModelReply, ModelTarget
from mainspring.scheduler.base import Membership
from mainspring.telemetry.metrics import ServingMetrics
from mainspring.telemetry.timeline import Timeline
from mainspring.time import NS_PER_S, Clock
from mainspring.transport.links import WorkerHandle

log = logging.getLogger("mainspring.controller.service")  # its lines read as the service's, as before


class WorkerHost(Protocol):
    """What the worker side needs of the service around it."""

    connected: WorkerSet
    controller: Controller
    lifecycle: ModelLifecycle
    load_limits: ServerLoadLimits
    metrics: ServingMetrics
    timeline: Timeline
    clock: Clock

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def policy(self) -> Membership: ...

    @property
    def device_count(self) -> int: ...

    def update_gauges(self) -> None: ...

    def announce_soon(self) -> None: ...


class WorkerEventHandler:
    """``WorkerEvents`` for the service: the transports (``WorkerHub``, ``InProcessWorker``) report here."""

    def __init__(self, host: WorkerHost, watchdog_grace_s: float) -> None:
        self._host = host
        self.watchdog_grace_s = watchdog_grace_s  # beyond an action's window and twice its expected duration
        self.rejoin = RejoinBackoff()  # for workers dropped for misbehaving
        # Models a worker may announce (the names of the repository the local workers serve); None: any.
        self.known_models: Callable[[], Collection[str]] | None = None
        self.worker_joined = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None
        self._bringing_in_line: set[asyncio.Task[None]] = set()

    def on_join(
        self, handle: WorkerHandle, devices: list[DeviceSpec], models: list[ModelInfo], errors: dict[str, str]
    ) -> None:
        host = self._host
        if self.known_models is not None:  # a worker may announce only the repository's models
            models, devices, errors = announced_only(handle.name, self.known_models(), models, devices, errors)
        host.connected.join(handle)
        host.lifecycle.load_errors.update(errors)
        corrections = host.lifecycle.adopt(handle, models)
        if not corrections:
            self._add_devices(handle, devices)
            return
        task = host.loop.create_task(self._bring_in_line(handle, devices, corrections))
        self._bringing_in_line.add(task)
        task.add_done_callback(self._bringing_in_line.discard)

    async def _bring_in_line(
        self, handle: WorkerHandle, devices: list[DeviceSpec], corrections: list[tuple[ModelOperation, ModelTarget]]
    ) -> None:
        kept = await self._host.lifecycle.bring_in_line(handle, devices, corrections)
        if kept is not None:
            self._add_devices(handle, kept)

    def _add_devices(self, handle: WorkerHandle, devices: list[DeviceSpec]) -> None:
        host = self._host
        for spec in host.connected.add_devices(handle, devices):
            host.policy.add_device(spec)
            host.timeline.add_device(spec.device, spec.resident, host.clock.now_ns())
        host.update_gauges()
        host.announce_soon()
        held = sum(len(spec.resident) for spec in devices)
        log.info("worker %s joined: %d device(s) already holding %d model(s); models %s",
                 handle.name, len(devices), held, sorted(host.lifecycle.models))  # fmt: skip
        self.worker_joined.set()
        if self._watchdog is None:
            self._watchdog = host.loop.create_task(self._watch_actions())
        host.load_limits.watch(host.loop)
        host.controller.pump()

    async def _watch_actions(self, period_s: float = 0.25) -> None:
        """A worker whose action never reports (a lane hung inside a live process, which still answers
        heartbeats) is dropped as lost: its requests are requeued where they can still make it and
        answered otherwise, and it is told to start over (``mainspring worker`` does, and
        ``mainspring serve`` restarts a local one that exits)."""
        host = self._host
        grace_ns = round(self.watchdog_grace_s * NS_PER_S)
        while True:
            await asyncio.sleep(period_s)
            now = host.clock.now_ns()
            for handle, device, action in list(host.connected.hung(host.controller, now, grace_ns)):
                if handle not in host.connected:
                    continue  # dropped for another of its devices
                late_s = (now - action.latest_ns - action.expected_duration_ns) / NS_PER_S
                host.metrics.hung_actions.inc()
                self.drop(handle, "hung", f"{type(action).__name__} action {action.action_id} on device "
                                          f"{device} has not reported {late_s:.1f} s after it was due")  # fmt: skip

    def stop(self) -> None:
        """Stop watching for hung actions (the service drains)."""
        if self._watchdog is not None:
            self._watchdog.cancel()

    def drop(self, handle: WorkerHandle, cause: str, why: str) -> None:
        """Drop a misbehaving worker (``cause``: hung, bad_result or bad_message) as lost: its requests
        are requeued where they can still make it and answered otherwise; it is told to start over
        (``mainspring worker`` does, and ``mainspring serve`` restarts a local one that exits) and may
        join again only after a backoff that grows with each drop (``RejoinBackoff``)."""
        if handle not in self._host.connected:
            return
        backoff_s = self.rejoin.dropped(handle.name)
        self._host.metrics.workers_dropped.labels(cause).inc()
        self._host.metrics.rejoin_backoff.set(backoff_s)
        log.error("worker %s: %s; dropping the worker (it may rejoin in %.0f s)", handle.name, why, backoff_s)
        handle.close(f"dropped: {why}: start over", start_over=True)
        self.on_lost(handle)

    def rejoin_wait_s(self, name: str) -> float:
        wait_s, first = self.rejoin.wait_s(name)
        if wait_s > 0:
            self._host.metrics.rejoins_deferred.inc()
            if first:
                log.warning("worker %s says hello %.1f s before its rejoin backoff ends: not answered until then",
                            name, wait_s)  # fmt: skip
        return wait_s

    def on_bad_message(self, handle: WorkerHandle, problem: str) -> None:
        self.drop(handle, "bad_message", f"sent a message that is not the protocol ({problem})")

    def on_result(self, handle: WorkerHandle, result: ActionResult) -> None:
        global_id = self._host.connected.global_id(handle, result.device)
        if global_id is None:
            return  # from a device already declared lost
        try:
            problem = self._host.controller.deliver_checked(
                msgspec.structs.replace(result, device=global_id), f"worker {handle.name}"
            )
        except UnknownActionError as error:
            problem = str(error)
        if problem is not None:
            self.drop(handle, "bad_result", f"sent a malformed result ({problem})")

    def on_lost(self, handle: WorkerHandle) -> None:
        host = self._host
        for global_id in host.connected.remove(handle):
            host.controller.remove_device(global_id)
            host.timeline.remove_device(global_id)
        host.update_gauges()
        host.announce_soon()
        log.warning("worker %s lost; %d device(s) left", handle.name, host.device_count)

    def on_model_reply(self, handle: WorkerHandle, reply: ModelReply) -> None:
        self._host.connected.reply(handle, reply)
