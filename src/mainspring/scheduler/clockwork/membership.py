"""Devices and models that come and go under the Clockwork policy (``scheduler.base.Membership``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mainspring.models.profile import ModelProfile
from mainspring.protocol import DeviceSpec, Infer, Request, ResponseStatus
from mainspring.scheduler.clockwork.tracker import DeviceState

if TYPE_CHECKING:
    from mainspring.scheduler.clockwork.policy import ClockworkScheduler


def add_device(s: ClockworkScheduler, spec: DeviceSpec) -> None:
    if spec.device in s._device_by_id:
        raise ValueError(f"device {spec.device} is already known")
    device = DeviceState(spec, s._rate_memory_ns)
    s.devices.append(device)
    s._device_by_id[spec.device] = device
    s._kinds = sorted({d.kind for d in s.devices})


def remove_device(s: ClockworkScheduler, device_id: int, now_ns: int) -> None:
    device = s._device_by_id.pop(device_id)
    s.devices.remove(device)
    s._kinds = sorted({d.kind for d in s.devices})
    for model in list(device.ready_ns):
        s.release(device, model)
    lost: list[Request] = []
    for action_id, flight in list(s._in_flight.items()):
        if flight.action.device == device_id:
            del s._in_flight[action_id]
            lost += flight.requests
    if not s.devices:
        _answer_everything(s, "no worker is connected")
    for request in lost:
        if not s.devices:
            s._answer(request, ResponseStatus.ERROR, "no worker is connected")
        elif request.model in s.profiles and _can_still_make_it(s, request, now_ns):
            s._enqueue(request)
        else:
            s._answer(
                request, ResponseStatus.ERROR, f"worker of device {device_id} was lost; the deadline cannot be met"
            )


def add_model(s: ClockworkScheduler, profile: ModelProfile) -> None:
    if profile.model in s.profiles:
        raise ValueError(f"model {profile.model!r} is already served")
    s.profiles[profile.model] = profile


def remove_model(s: ClockworkScheduler, model: str, now_ns: int) -> None:
    reason = f"model {model!r} was unloaded"
    queue = s.queues.get(model)
    while queue is not None and queue.count:
        s._answer(queue.pop(), ResponseStatus.ERROR, reason)
    s._drop_queue_if_empty(model)
    for flight in s._in_flight.values():
        if flight.action.model == model and isinstance(flight.action, Infer):
            for request in flight.requests:
                s._answer(request, ResponseStatus.ERROR, reason)
            flight.requests = []
    for device in s.devices:
        s.release(device, model)
        device.pinned.pop(model, None)
    s.turned_away.discard(model)
    s._model_demand.pop(model, None)
    s._batch_sizes.pop(model, None)
    s.estimator.forget(model)
    s._forget_model(model)


def _can_still_make_it(s: ClockworkScheduler, request: Request, now_ns: int) -> bool:
    fastest = min(s.fastest_ns(request.model, kind) for kind in s._kinds)
    return now_ns + fastest <= request.deadline_ns


def _answer_everything(s: ClockworkScheduler, reason: str) -> None:
    for model in list(s.queues):
        queue = s.queues[model]
        while queue.count:
            s._answer(queue.pop(), ResponseStatus.ERROR, reason)
        s._drop_queue_if_empty(model)
    for flight in s._in_flight.values():
        for request in flight.requests:
            s._answer(request, ResponseStatus.ERROR, reason)
        flight.requests = []
