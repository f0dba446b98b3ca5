"""The controller's CPU time per policy call, as a deterministic model.

The simulator charges it to simulated time (``sim/core.py``): a controller core is busy for as
long as its policy takes, so an overloaded one plans late, as it does live. The coefficients are
least-squares fits of the policy's own thread time per call (``TimedScheduler``'s measure), over
runs of 1 to 16 devices: ``.venv/bin/python benchmarks/controller_cost_fit.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mainspring.protocol import ActionResult, Request
from mainspring.scheduler.base import Decisions, Scheduler


def _check_terms(terms: dict[str, object]) -> None:
    negative = [name for name, value in terms.items() if isinstance(value, int | float) and value < 0]
    if negative:
        raise ValueError(f"controller cost coefficients must not be negative: {', '.join(negative)}")


@dataclass(frozen=True)
class ProcessCost:
    """Nanoseconds of the live controller process's event loop beyond the policy, per event it handles."""

    request_ns: int = 0  # per request taken in: decoding it, admission, its metrics, the loop's share
    answer_ns: int = 0  # per request answered: its future, encoding and sending the answer
    action_ns: int = 0  # per action sent: encoding and sending it, its metrics, the loop's share
    result_ns: int = 0  # per result taken in: decoding and checking it
    refusal_ns: int = 0  # per request refused at once (max_loop_lag): decoded and answered, never admitted
    background: float = 0.0  # share of the core timers and the load signal take whatever the load

    def __post_init__(self) -> None:
        _check_terms(vars(self))
        if self.background >= 1:
            raise ValueError(f"a background share must be below 1, got {self.background}")

    def loaded(self, ns: int) -> int:
        """``ns`` of work, on a core whose background takes its share too: it ends that much later."""
        return ns if not self.background else round(ns / (1 - self.background))


@dataclass(frozen=True)
class FrontendCost:
    """Nanoseconds of a frontend process's core (HTTP, parsing, routing to a cell, the answer back)."""

    request_ns: int = 0  # per call served, in and out
    refusal_ns: int = 0  # per call shed at arrival (429 before its body is read)
    background: float = 0.0  # share of the core its timers take whatever the load

    def __post_init__(self) -> None:
        ProcessCost(background=self.background)  # the same checks
        _check_terms(vars(self))

    @property
    def free(self) -> bool:
        return not (self.request_ns or self.refusal_ns or self.background)

    def loaded(self, ns: int) -> int:
        return ns if not self.background else round(ns / (1 - self.background))


@dataclass(frozen=True)
class ControllerCost:
    """Nanoseconds of one controller core per call of the scheduler contract; ``process`` adds what the
    live process spends around those calls, ``frontend`` what a frontend process spends per call."""

    request_ns: int  # on_request: admission, queueing
    result_ns: int  # on_result: lane re-anchoring, estimates, answers of a batch
    pass_ns: int  # schedule: the fixed part of one pass
    pass_per_device_ns: int  # schedule: grows with the devices of the cell (holders weighed on each)
    action_ns: int  # schedule: each action planned
    answer_ns: int  # schedule: each request answered (a batch's, or a rejection)
    process: ProcessCost = field(default_factory=ProcessCost)  # none: the policy alone
    frontend: FrontendCost = field(default_factory=FrontendCost)  # none: the frontend costs nothing

    def __post_init__(self) -> None:
        _check_terms(vars(self))

    def schedule(self, devices: int, actions: int, answers: int) -> int:
        return self.pass_ns + self.pass_per_device_ns * devices + self.action_ns * actions + self.answer_ns * answers


# Fitted on 2026-12-05 on the 2-core development machine (Python 3.11, clockwork policy, built-in
# V100 profiles, Poisson at 250 r/s per device, 1/4/8/16 devices); see the module docstring.
CLOCKWORK_COST = ControllerCost(
    request_ns=28_600, result_ns=16_500, pass_ns=12_800, pass_per_device_ns=700, action_ns=70_700, answer_ns=1_000
)
FREE = ControllerCost(0, 0, 0, 0, 0, 0)

# The live processes around the policy, fitted by ``benchmarks/live_cost_fit.py`` on
# ``benchmarks/controller_cost_live.py``'s rows (one cell, 8 emulated V100s, 200 models, 100 ms SLO): fitted on
# 2026-12-06 on the 2-core development machine, quiet (no other work), rates 300/600/900/1200 r/s, 8 s each,
# ledger on and off: ``controller_cost_live.py --rates 300,600,900,1200 --seconds 8 --json rows.json`` then
# ``live_cost_fit.py rows.json``; predicted/measured 0.93-1.22 (controller), 0.96-1.10 (frontend). The
# frontend's refusal is not in the rows (none below the knee): a quarter of a served call, an estimate.
LIVE_PROCESS_COST = ProcessCost(
    request_ns=19_500, answer_ns=44_100, action_ns=166_600, result_ns=80_400, refusal_ns=44_100, background=0.094
)
LIVE_FRONTEND_COST = FrontendCost(request_ns=328_900, refusal_ns=82_200, background=0.1722)
# What ``simulate --cells N`` charges by default: the policy's calls, the process around them, the frontend.
LIVE_COST = replace(CLOCKWORK_COST, process=LIVE_PROCESS_COST, frontend=LIVE_FRONTEND_COST)


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
        self._charge(self.cost.request_ns + self.cost.process.request_ns)

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        self.inner.on_result(result, now_ns)
        self._charge(self.cost.result_ns + self.cost.process.result_ns)

    def schedule(self, now_ns: int) -> Decisions:
        decisions = self.inner.schedule(now_ns)
        actions, answers = len(decisions.actions), len(decisions.responses)
        around = self.cost.process.action_ns * actions + self.cost.process.answer_ns * answers
        self._charge(self.cost.schedule(self.devices, actions, answers) + around)
        return decisions

    def refuse(self) -> None:
        """A request refused before it reached the policy (its controller too far behind)."""
        self._charge(self.cost.process.refusal_ns)

    def take(self) -> int:
        """The modelled time charged since the last ``take``."""
        busy, self.busy_ns = self.busy_ns, 0
        return busy

    def charge(self, ns: int) -> None:
        """Work the controller does besides the contract's calls (its load signal)."""
        self._charge(ns)

    def _charge(self, ns: int) -> None:
        ns = self.cost.process.loaded(ns)
        self.busy_ns += ns
        self.total_ns += ns

    def __getattr__(self, name: str) -> object:  # membership and the load signal reach the policy
        return getattr(self.inner, name)
