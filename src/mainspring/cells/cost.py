"""The controller's CPU time per policy call, as a deterministic model.

The simulator charges it to simulated time (``sim/core.py``): a controller core is busy for as
long as its policy takes, so an overloaded one plans late, as it does live. The coefficients are
least-squares fits of the policy's own thread time per call (``TimedScheduler``'s measure), over
runs of 1 to 16 devices: ``.venv/bin/python benchmarks/controller_cost_fit.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mainspring.protocol import ActionResult, Request
from mainspring.scheduler.base import Decisions, Scheduler


@dataclass(frozen=True)
class ControllerCost:
    """Nanoseconds of one controller core per call of the scheduler contract."""

    request_ns: int  # on_request: admission, queueing
    result_ns: int  # on_result: lane re-anchoring, estimates, answers of a batch
    pass_ns: int  # schedule: the fixed part of one pass
    pass_per_device_ns: int  # schedule: grows with the devices of the cell (holders weighed on each)
    action_ns: int  # schedule: each action planned
    answer_ns: int  # schedule: each request answered (a batch's, or a rejection)

    def __post_init__(self) -> None:
        negative = [name for name, value in vars(self).items() if value < 0]
        if negative:
            raise ValueError(f"controller cost coefficients must not be negative: {', '.join(negative)}")

    def schedule(self, devices: int, actions: int, answers: int) -> int:
        return self.pass_ns + self.pass_per_device_ns * devices + self.action_ns * actions + self.answer_ns * answers


# Fitted on 2026-12-05 on the 2-core development machine (Python 3.11, clockwork policy, built-in
# V100 profiles, Poisson at 250 r/s per device, 1/4/8/16 devices); see the module docstring.
CLOCKWORK_COST = ControllerCost(
    request_ns=28_600, result_ns=16_500, pass_ns=12_800, pass_per_device_ns=700, action_ns=70_700, answer_ns=1_000
)
FREE = ControllerCost(0, 0, 0, 0, 0, 0)


class CostedScheduler:
    """Forwards the scheduler contract to ``inner`` and adds up the modelled CPU time of each call
    in ``busy_ns`` (its owner takes it with ``take``); ``devices`` sizes the per-pass term."""

    def __init__(self, inner: Scheduler, cost: ControllerCost, devices: int) -> None:
        self.inner = inner
        self.cost = cost
        self.devices = devices
        self.busy_ns = 0
        self.total_ns = 0  # every call's modelled cost, for the report

    def on_request(self, request: Request, now_ns: int) -> None:
        self.inner.on_request(request, now_ns)
        self._charge(self.cost.request_ns)

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        self.inner.on_result(result, now_ns)
        self._charge(self.cost.result_ns)

    def schedule(self, now_ns: int) -> Decisions:
        decisions = self.inner.schedule(now_ns)
        self._charge(self.cost.schedule(self.devices, len(decisions.actions), len(decisions.responses)))
        return decisions

    def take(self) -> int:
        """The modelled time charged since the last ``take``."""
        busy, self.busy_ns = self.busy_ns, 0
        return busy

    def charge(self, ns: int) -> None:
        """Work the controller does besides the contract's calls (its load signal)."""
        self._charge(ns)

    def _charge(self, ns: int) -> None:
        self.busy_ns += ns
        self.total_ns += ns

    def __getattr__(self, name: str) -> object:  # membership and the load signal reach the policy
        return getattr(self.inner, name)
