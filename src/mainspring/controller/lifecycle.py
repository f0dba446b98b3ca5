"""The live controller's models: which are served under which key, and their changes through the
repository API (load; reload in place beside the served version; unload after the admitted requests
are answered), one change of a model at a time; and what a joining worker must change to serve
exactly what is served here."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Protocol

import msgspec

from mainspring.controller.controller import Controller
from mainspring.controller.workers import WorkerSet
from mainspring.frontend.port import ServedModel, ServiceError
from mainspring.models.profile import ModelProfile
from mainspring.protocol import DeviceSpec
from mainspring.protocol.model_names import client_name, reload_key
from mainspring.protocol.models import ModelInfo, ModelOperation, ModelReply, ModelTarget
from mainspring.scheduler.base import Membership
from mainspring.telemetry.metrics import ServingMetrics
from mainspring.time import NS_PER_S, Clock
from mainspring.transport.links import WorkerHandle

log = logging.getLogger("mainspring.controller.service")  # its lines read as the service's, as before

UNLOADED = "unloaded"  # why a model unloaded through the API is not served (Triton's reason in the index)


class LifecycleHost(Protocol):
    """What the model lifecycle needs of the service around it."""

    connected: WorkerSet
    controller: Controller
    clock: Clock
    metrics: ServingMetrics

    @property
    def policy(self) -> Membership: ...

    def open_count(self, key: str) -> int: ...

    def update_gauges(self) -> None: ...

    async def announce(self) -> None: ...


class ModelLifecycle:
    def __init__(self, host: LifecycleHost) -> None:
        self._host = host
        self.models: dict[str, ServedModel] = {}
        self.load_errors: dict[str, str] = {}
        self.unloading: set[str] = set()
        self._changing: dict[str, asyncio.Lock] = {}  # one load, reload or unload of a model at a time
        self._unloaded: set[str] = set()  # unloaded through the API: a worker that joins later must not serve them
        self._generations = itertools.count(2)  # of reloads in place: the internal names' suffixes

    def adopt(self, handle: WorkerHandle, models: list[ModelInfo]) -> list[tuple[ModelOperation, ModelTarget]]:
        """Serve the joining worker's models that nothing here contradicts (the first worker's: all of them),
        under the names it holds them by; return what the worker must change to serve exactly what is served
        here, as it is served: a model at another version or config, one unloaded through the API, one a
        reload in place has retired, one it lacks."""
        corrections, matching = [], set()
        for info in models:
            key = info.config.name
            name = client_name(key)
            served = self.models.get(name)
            if served is None and name not in self._unloaded:  # under its key: a restarted controller's worker
                profile = ModelProfile.from_json(info.profile, f"worker {handle.name} model {key}")
                self._host.policy.add_model(profile)
                config = msgspec.structs.replace(info.config, name=name)
                self.models[name] = ServedModel(config, profile.renamed(name), info.version, key)
                load_s = info.load_ns / NS_PER_S if info.load_ns else None  # loaded before it joined, in its time
                self._host.metrics.triton.serve(key, info.version, load_s)
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

    async def bring_in_line(
        self, handle: WorkerHandle, devices: list[DeviceSpec], corrections: list[tuple[ModelOperation, ModelTarget]]
    ) -> list[DeviceSpec] | None:
        """Apply ``corrections`` on the joining worker; the devices to plan on (weights it held of a model it
        was told to change are not adopted: unloading freed them), None if it was lost meanwhile."""
        changed = set()
        for op, target in corrections:
            changed.add(target.key)
            try:
                replies = await self._host.connected.model_op(op, target, 120.0, handles=[handle])
            except ServiceError as error:
                replies = [ModelReply(0, target.key, error=str(error))]
            for reply in replies:
                if reply.error:
                    log.error("worker %s: %s of %s failed, so its devices will fail that model's actions: %s",
                              handle.name, op.value, target.key, reply.error)  # fmt: skip
            log.info("worker %s: %s of %s done, to serve what is served here", handle.name, op.value, target.key)
        if handle not in self._host.connected:
            return None
        return [msgspec.structs.replace(d, resident=tuple(m for m in d.resident if m not in changed)) for d in devices]

    async def load(self, model: str, timeout_s: float = 120.0) -> None:
        async with self._change(model, "load"):
            if model not in self.models:  # served already, or once a change this one waited for finished
                self.models[model] = await self._load_everywhere(ModelTarget(model), timeout_s)
                self._unloaded.discard(model)
                self._host.update_gauges()
                await self._host.announce()

    async def reload(self, model: str, timeout_s: float = 120.0) -> None:
        """Serve the repository's entry for ``model`` anew without refusing a request (Triton's load of a
        loaded model): load it beside the one served, under an internal name; send new requests there;
        let those admitted finish on the old; then unload the old. A load that fails leaves the old served."""
        async with self._change(model, "reload"):
            old = self.models.get(model)
            if old is None:
                raise ServiceError("not_found", f"model {model!r} is not loaded")
            key = old.key
            while key == old.key:  # a key adopted from a worker may have any suffix
                key = reload_key(model, next(self._generations))
            target = ModelTarget(model, served_as=key)
            begin = time.monotonic()
            self.models[model] = new = await self._load_everywhere(target, timeout_s, keep_reason=False)
            await self._host.announce()
            loaded = time.monotonic()
            await self._drain(old.key, timeout_s)
            await self._retire(old.key, timeout_s)
            retired = time.monotonic()
            log.info("%s: version %d serves as %s after %.2f s; version %d (%s) retired %.2f s later", model,
                     new.version, key, loaded - begin, old.version, old.key, retired - loaded)  # fmt: skip

    async def unload(self, model: str, timeout_s: float = 60.0) -> None:
        """Refuse new requests for ``model``, let the admitted ones finish (each is answered by its
        deadline at the latest, so ``timeout_s`` only bounds a bug), then unload it everywhere."""
        async with self._change(model, "unload"):
            served = self.models.get(model)
            if served is None:
                raise ServiceError("not_found", f"model {model!r} is not loaded")
            self.unloading.add(model)
            try:
                await self._drain(served.key, timeout_s)
            finally:
                self.unloading.discard(model)
            del self.models[model]
            self._unloaded.add(model)
            self.load_errors[model] = UNLOADED  # a model a worker announced can be loaded back (not in the folder)
            self._host.update_gauges()
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
                    self._host.metrics.model_changes.labels(model, change, "failed").inc()
                raise
            if change != "load" or not served_before:
                self._host.metrics.model_changes.labels(model, change, "done").inc()

    async def _load_everywhere(self, target: ModelTarget, timeout_s: float, keep_reason: bool = True) -> ServedModel:
        """Load ``target`` on every worker and into the policy; on a failure anywhere, nowhere (the reason
        stays in the repository index when ``keep_reason``: the model is not served)."""
        model = target.model
        if not self._host.connected:
            raise ServiceError("unavailable", "no worker is connected")
        begin = self._host.clock.now_ns()  # its load time, Triton's: until every worker has it ready
        try:
            replies = await self._host.connected.model_op(ModelOperation.LOAD, target, timeout_s)
        except ServiceError:  # a worker did not answer in time: the others must not keep what they loaded
            with contextlib.suppress(ServiceError):
                await self._host.connected.model_op(ModelOperation.UNLOAD, target, timeout_s)
            raise
        failed = [r for r in replies if r.error]
        if failed or not replies:
            if len(failed) < len(replies):
                await self._host.connected.model_op(
                    ModelOperation.UNLOAD, target, timeout_s
                )  # keep the workers consistent
            reason = failed[0].error if failed else f"no worker answered for {model!r}"
            if keep_reason:
                self.load_errors[model] = reason  # the repository index tells why the model is not served
                await self._host.announce()
            raise ServiceError("invalid", reason)
        info = replies[0].info
        assert info is not None
        self._host.metrics.triton.serve(target.key, info.version, (self._host.clock.now_ns() - begin) / NS_PER_S)
        profile = ModelProfile.from_json(info.profile, f"model {target.key}")
        self._host.policy.add_model(profile)
        self.load_errors.pop(model, None)
        config = msgspec.structs.replace(info.config, name=model)  # clients see the model's own name
        return ServedModel(config, profile.renamed(model), info.version, target.key)

    async def _drain(self, key: str, timeout_s: float) -> None:
        """Wait until the requests admitted for ``key`` are answered (by their deadlines), at most ``timeout_s``."""
        deadline = self._host.clock.now_ns() + round(timeout_s * NS_PER_S)
        while self._host.open_count(key) and self._host.clock.now_ns() < deadline:
            await asyncio.sleep(0.005)

    async def _retire(self, key: str, timeout_s: float) -> None:
        """Take ``key`` out of the policy (answering what it still queues) and off every worker."""
        self._host.metrics.triton.retire(key)
        self._host.policy.remove_model(key, self._host.clock.now_ns())
        self._host.controller.pump()  # hand out the answers of its queued requests
        await self._host.announce()
        await self._host.connected.model_op(
            ModelOperation.UNLOAD, ModelTarget(client_name(key), served_as=key), timeout_s
        )
