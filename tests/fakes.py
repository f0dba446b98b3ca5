"""Every test double in one place."""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator, Sequence

from mainspring.models.profile import ModelProfile
from mainspring.protocol import CPU_KIND, Action, ActionResult, ActionStatus, LoadWeights, Request, Response, Timing
from mainspring.protocol.pages import MIB
from mainspring.scheduler.base import Decisions, Scheduler
from mainspring.time import NS_PER_MS, ms_to_ns
from mainspring.workload.base import Arrival, Workload

PAGE = 16 * MIB
# resnet18 (64x64) on one thread of this machine's CPU (``benchmarks/closed_loop_noise.py``)
CPU_RESNET18 = ModelProfile(
    "resnet18",
    CPU_KIND,
    46_796_608,
    ms_to_ns(36),
    {1: ms_to_ns(9.8), 2: ms_to_ns(16.6), 4: ms_to_ns(23.5), 8: ms_to_ns(40.3)},
)


def profile(
    name: str = "m",
    exec_ms: dict[int, float] | None = None,
    load_ms: float = 5.0,
    pages: int = 2,
) -> ModelProfile:
    """A hand-made profile: ``pages`` full 16 MiB pages, exact durations."""
    exec_ms = exec_ms or {1: 2.0, 2: 3.0, 4: 5.0, 8: 9.0}
    return ModelProfile(
        model=name,
        device_kind="v100",
        weights_bytes=pages * PAGE,
        load_ns=round(load_ms * NS_PER_MS),
        exec_ns={b: round(ms * NS_PER_MS) for b, ms in exec_ms.items()},
    )


def request(request_id: int, model: str, at_ns: int, slo_ms: float = 100, margin_ns: int = 0) -> Request:
    """A request arriving at ``at_ns`` with a relative SLO, its answer's trip back taking ``margin_ns``."""
    return Request.arriving(request_id, model, at_ns, round(slo_ms * NS_PER_MS), margin_ns)


def ok(action_id: int, device: int, begin_ns: int, end_ns: int) -> ActionResult:
    """A successful result measured from ``begin_ns`` to ``end_ns``."""
    return ActionResult(action_id, device, ActionStatus.OK, Timing(begin_ns, end_ns))


class ResultLog:
    """A result sink that keeps what it was given, in order."""

    def __init__(self) -> None:
        self.results: list[ActionResult] = []

    def __call__(self, result: ActionResult) -> None:
        self.results.append(result)

    def by_id(self, action_id: int) -> ActionResult:
        return next(r for r in self.results if r.action_id == action_id)


class ScriptedScheduler:
    """A policy whose next decisions a test sets by hand; it records what it was told."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.results: list[ActionResult] = []
        self.next = Decisions()

    def on_request(self, request: Request, now_ns: int) -> None:
        self.requests.append(request)

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        self.results.append(result)

    def schedule(self, now_ns: int) -> Decisions:
        decisions, self.next = self.next, Decisions()
        return decisions


class ActionInbox:
    """A worker link that keeps the actions sent to it."""

    def __init__(self) -> None:
        self.actions: list[Action] = []

    def submit(self, action: Action) -> None:
        self.actions.append(action)


class FixedArrivals(Workload):
    """A workload that replays a given list of arrivals."""

    name = "fixed"

    def __init__(self, arrivals: list[Arrival]) -> None:
        self._arrivals = sorted(arrivals, key=lambda a: a.time_ns)

    def arrivals(self, models: Sequence[ModelProfile], duration_ns: int, rng: random.Random) -> Iterator[Arrival]:
        return iter([a for a in self._arrivals if a.time_ns < duration_ns])


def run_one_device(policy: Scheduler, start_ns: int, until_ns: int) -> tuple[list[Action], list[Response]]:
    """Drive ``policy`` on device 0 from ``start_ns`` to ``until_ns``: each action runs exactly as predicted,
    from the later of its earliest start and the time its lane (load or exec) frees; ``schedule`` is called
    at each wakeup and each result. Returns every action sent and every response given, in order."""
    actions: list[Action] = []
    responses: list[Response] = []
    results: list[tuple[int, int, int]] = []  # (end, action id, begin): the device's results, in time order
    lanes = {"load": 0, "exec": 0}  # when each lane of the device frees
    now = start_ns
    while now < until_ns:
        while results and results[0][0] <= now:
            end, action_id, begin = heapq.heappop(results)
            policy.on_result(ok(action_id, 0, begin, end), end)
        decisions = policy.schedule(now)
        responses += decisions.responses
        for action in decisions.actions:
            lane = "load" if isinstance(action, LoadWeights) else "exec"
            begin = max(now, action.earliest_ns, lanes[lane])
            lanes[lane] = begin + action.expected_duration_ns
            heapq.heappush(results, (lanes[lane], action.action_id, begin))
            actions.append(action)
        wakeup = decisions.wakeup_ns if decisions.wakeup_ns is not None else until_ns
        now = max(now + 1, min(wakeup, results[0][0]) if results else wakeup)
    return actions, responses
