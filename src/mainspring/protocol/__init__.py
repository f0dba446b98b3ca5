"""Messages between clients, controller and workers."""

from mainspring.protocol.actions import Action, EvictWeights, Infer, LoadWeights, action_kind
from mainspring.protocol.devices import CPU_KIND, DeviceSpec
from mainspring.protocol.requests import MAX_SLO_MS, Outcome, Request, Response, ResponseStatus
from mainspring.protocol.results import ActionResult, ActionStatus, Timing

__all__ = [
    "CPU_KIND",
    "MAX_SLO_MS",
    "Action",
    "ActionResult",
    "ActionStatus",
    "DeviceSpec",
    "EvictWeights",
    "Infer",
    "LoadWeights",
    "Outcome",
    "Request",
    "Response",
    "ResponseStatus",
    "Timing",
    "action_kind",
]
