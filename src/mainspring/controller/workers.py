"""The live controller's workers: who is connected, their devices under the controller's own ids, the
model operations sent to them and their replies, and which of them hangs (its action overdue)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field

import msgspec

from mainspring.controller.controller import Controller
from mainspring.frontend.port import ServiceError
from mainspring.protocol import Action, DeviceSpec
from mainspring.protocol.model_names import client_name
from mainspring.protocol.models import ModelInfo, ModelOperation, ModelReply, ModelTarget
from mainspring.transport.links import WorkerHandle

log = logging.getLogger("mainspring.controller.service")


def announced_only(
    worker: str, known: Collection[str], models: list[ModelInfo], devices: list[DeviceSpec], errors: dict[str, str]
) -> tuple[list[ModelInfo], list[DeviceSpec], dict[str, str]]:
    """A joining worker's models, devices' resident models and load errors, less what names a model
    not in ``known`` (the repository's): such a model is ignored, with a warning, never served."""
    known = set(known)
    unknown = sorted({info.config.name for info in models if client_name(info.config.name) not in known})
    if not unknown and all(client_name(m) in known for m in errors):
        return models, devices, errors
    if unknown:
        log.warning("worker %s announces %d model(s) the repository does not have, ignored: %s",
                    worker, len(unknown), ", ".join(unknown[:10]) + (" ..." if len(unknown) > 10 else ""))  # fmt: skip
    kept = [info for info in models if client_name(info.config.name) in known]
    kept_devices = [
        msgspec.structs.replace(d, resident=tuple(m for m in d.resident if client_name(m) in known)) for d in devices
    ]
    return kept, kept_devices, {m: e for m, e in errors.items() if client_name(m) in known}


class DeviceLink:
    """The controller's link for one global device id: the worker and its own id for the device."""

    def __init__(self, handle: WorkerHandle, local_device: int) -> None:
        self.handle = handle
        self.local_device = local_device

    def submit(self, action: Action, inputs: list[object] | None = None) -> None:
        self.handle.send_action(msgspec.structs.replace(action, device=self.local_device), inputs)


@dataclass
class _ModelOp:
    model: str
    op: ModelOperation
    waiting: set[int]  # id() of the handles that have not replied
    replies: list[ModelReply] = field(default_factory=list)
    done: asyncio.Future[list[ModelReply]] | None = None


class WorkerSet:
    """Connected workers and their devices; ``links`` (global device id -> link) is the controller's."""

    def __init__(self) -> None:
        self.links: dict[int, DeviceLink] = {}
        self.specs: dict[int, DeviceSpec] = {}  # global device id -> its spec (its pool: a cell's capacity)
        self._handles: dict[int, WorkerHandle] = {}
        self._devices_of: dict[int, list[int]] = {}  # id(handle) -> global device ids
        self._global_id: dict[tuple[int, int], int] = {}  # (id(handle), local device) -> global id
        self._device_ids = itertools.count()
        self._op_ids = itertools.count(1)
        self._ops: dict[int, _ModelOp] = {}

    @property
    def handles(self) -> list[WorkerHandle]:
        return list(self._handles.values())

    def __contains__(self, handle: WorkerHandle) -> bool:
        return id(handle) in self._handles

    def __len__(self) -> int:
        return len(self._handles)

    def join(self, handle: WorkerHandle) -> None:
        self._handles[id(handle)] = handle

    def add_devices(self, handle: WorkerHandle, devices: Sequence[DeviceSpec]) -> Iterator[DeviceSpec]:
        """Each of the worker's devices under a new global id (what the policy is told)."""
        key = id(handle)
        for spec in devices:
            global_id = next(self._device_ids)
            self.links[global_id] = DeviceLink(handle, spec.device)
            self._global_id[key, spec.device] = global_id
            self._devices_of.setdefault(key, []).append(global_id)
            self.specs[global_id] = msgspec.structs.replace(spec, device=global_id)
            yield self.specs[global_id]

    def global_id(self, handle: WorkerHandle, local_device: int) -> int | None:
        """The global id of a worker's device; None once it is lost."""
        return self._global_id.get((id(handle), local_device))

    def remove(self, handle: WorkerHandle) -> list[int]:
        """Forget the worker; the global ids of its devices (its model operations stop waiting for it)."""
        key = id(handle)
        self._handles.pop(key, None)
        lost = self._devices_of.pop(key, [])
        for global_id in lost:
            del self.links[global_id]
            del self.specs[global_id]
        self._global_id = {k: v for k, v in self._global_id.items() if v not in lost}
        for op in list(self._ops.values()):
            op.waiting.discard(key)
            _finish_if_done(op)
        return lost

    def hung(self, controller: Controller, now_ns: int, grace_ns: int) -> Iterator[tuple[WorkerHandle, int, Action]]:
        """Workers with an action overdue by ``grace_ns`` past its window and twice its expected duration:
        (worker, device, action), one per device."""
        for device, action in controller.overdue_devices(now_ns, grace_ns).items():
            link = self.links.get(device)
            if link is not None and link.handle in self:
                yield link.handle, device, action

    async def model_op(
        self, op: ModelOperation, target: ModelTarget, timeout_s: float, handles: Sequence[WorkerHandle] = ()
    ) -> list[ModelReply]:
        """``op`` on ``handles`` (default: every worker); their replies."""
        handles = list(handles or self._handles.values())
        op_id = next(self._op_ids)
        done = asyncio.get_running_loop().create_future()
        self._ops[op_id] = _ModelOp(target.key, op, {id(h) for h in handles}, done=done)
        for handle in handles:
            handle.model_op(op_id, op, target)
        try:
            return await asyncio.wait_for(done, timeout_s)
        except TimeoutError:
            raise ServiceError(
                "unavailable", f"{op.value} of {target.key!r}: workers did not answer in {timeout_s:.0f} s"
            ) from None
        finally:
            del self._ops[op_id]

    def reply(self, handle: WorkerHandle, reply: ModelReply) -> None:
        op = self._ops.get(reply.op_id)
        if op is not None:
            op.waiting.discard(id(handle))
            op.replies.append(reply)
            _finish_if_done(op)


def _finish_if_done(op: _ModelOp) -> None:
    if not op.waiting and op.done is not None and not op.done.done():
        op.done.set_result(op.replies)
