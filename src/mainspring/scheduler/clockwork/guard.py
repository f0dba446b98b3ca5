"""Classes of work: keep enough devices responsive for models whose SLO a looser model's batch would break.

Non-preemptive devices let a long batch of a model with a loose SLO (a batch client: 16 requests,
22 ms) delay a request of a model with a tight one (a 3.3 ms inference due in 11 ms) past its
deadline. Capping the loose batches everywhere protects the tight class but costs the batch work
most of its throughput; capping them nowhere hands every device to the batches. The guard takes
the middle: the tight class's recent work (arrival rate times its batch-1 time) at
``guard_utilization`` sets how many devices stay *responsive*; the tight models are held on every
one of them (``LoadPlanner``, ahead of its tiers, with at most half a device's pages), and there a
looser model's batch is cut so that ``guard_room`` tight batch-1 inferences arriving as it is
planned still meet their deadline after it (and after what is booked before it), or one where
that leaves no batch. A looser model whose batch-1 alone would break a tight deadline does not
run on a responsive device while another device holds it; where none does, it runs in batches of
one if the tight deadline leaves more than half of one, else whole. The other devices run full
batches.

A model is *tight* when an active model of a looser class (an SLO at least ``CLASS_RATIO`` times
its own) has a largest batch longer than what the tight one can wait: with one SLO for everything
(most traces) the guard does nothing.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass

from mainspring.scheduler.clockwork.batching import BatchPlanner, Choice
from mainspring.scheduler.clockwork.state import PolicyState
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.lanes import NEVER
from mainspring.time import NS_PER_S, ms_to_ns

REFRESH_NS = ms_to_ns(50)  # rates decay over a second: a plan a few tens of ms old is as good
ACTIVE_PER_NS = 1.0 / NS_PER_S  # a model counts while its recent arrivals exceed one a second
CLASS_RATIO = 2  # SLOs within this factor are one class: an SLO sweep's step or a client's variation is not two


@dataclass(frozen=True, slots=True)
class GuardPlan:
    """``tight``: per tight model, (what its deadline leaves after its own batch-1 inference, how long
    a looser batch may run ahead of its request leaving room for ``guard_room`` of them), before what
    is booked (ns); ``responsive``: the devices where the looser batches are cut."""

    tight: dict[str, tuple[int, int]]
    responsive: frozenset[int]


NO_PLAN = GuardPlan({}, frozenset())


class TightClassGuard:
    """Which models are tight, which devices stay responsive for them, and the cap on a batch there."""

    def __init__(self, state: PolicyState) -> None:
        self.state = state
        config = state.config
        self._margin_ns = config.deadline_margin_ns
        self._utilization = config.guard_utilization
        self._room = config.guard_room
        self._slo_of: dict[str, int] = {}
        self._slos = Counter[int]()  # models per SLO: one SLO for all (the common case) is one check
        self._plan = NO_PLAN
        self._planned_ns = -REFRESH_NS

    def saw(self, model: str, slo_ns: int) -> None:
        """A request of ``model`` arrived with ``slo_ns``."""
        old = self._slo_of.get(model)
        if old == slo_ns:
            return
        self._uncount(old)
        self._slo_of[model] = slo_ns
        self._slos[slo_ns] += 1

    def forget(self, model: str) -> None:
        """``model`` was removed."""
        self._uncount(self._slo_of.pop(model, None))
        self.reset()

    def _uncount(self, slo_ns: int | None) -> None:
        if slo_ns is not None:
            self._slos[slo_ns] -= 1
            if not self._slos[slo_ns]:
                del self._slos[slo_ns]

    def reset(self) -> None:
        """Work the plan out afresh at its next use (a model or a device came or went)."""
        self._plan = NO_PLAN
        self._planned_ns = -REFRESH_NS

    def plan(self, now_ns: int) -> GuardPlan:
        """The current plan, worked out afresh every ``REFRESH_NS``."""
        if len(self._slos) < 2 or max(self._slos) < CLASS_RATIO * min(self._slos):
            self._plan = NO_PLAN  # one class: the common case, a check of the SLOs' range
        elif now_ns - self._planned_ns >= REFRESH_NS:
            self._planned_ns = now_ns
            self._plan = self._work_out(now_ns)
        return self._plan

    @property
    def guarding(self) -> bool:
        """Whether the last plan has tight models."""
        return bool(self._plan.tight)

    def cap_ns(self, device: DeviceState, model: str, start_ns: int, now_ns: int) -> int | None:
        """How long a batch of ``model`` starting at ``start_ns`` on ``device`` may run (None: any)."""
        plan = self.plan(now_ns)
        if device.spec.device not in plan.responsive:
            return None
        own_slo = self._slo_of.get(model, 0)
        single = self.state.shapes.fastest_ns(model, device.kind)
        cap: int | None = None
        for tight, (slack_ns, wait_ns) in plan.tight.items():
            if own_slo < CLASS_RATIO * self._slo_of[tight] or tight not in device.ready_ns:
                continue
            # Room for ``guard_room`` tight inferences if a batch-1 fits so, else for one. A model whose
            # batch-1 leaves no room does not run here while another device can take it. Held only here,
            # it is cut to batch-1 while that spares a tight request arriving in the batch's second half
            # (slack above half of it), and runs whole where it would spare less (cutting buys little).
            if wait_ns >= single:
                allowed = wait_ns
            elif slack_ns >= single:
                allowed = single
            elif self._held_elsewhere(model, plan.responsive):
                allowed = wait_ns
            elif 2 * slack_ns > single:
                allowed = single
            else:
                continue
            cap = allowed if cap is None else min(cap, allowed)
        if cap is None:
            return None
        return cap - max(0, start_ns - now_ns)  # a tight request arriving now waits for what is booked, too

    def allow(
        self, device: DeviceState, chosen: Choice, choices: list[Choice], now_ns: int, batches: BatchPlanner
    ) -> tuple[Choice | None, int]:
        """What of ``chosen`` may run on ``device``: cut to the cap, or else the next most urgent of
        ``choices`` the cap lets run (None: run nothing yet); and when to look again (``NEVER``: no
        need), where the lane's booking is what stops a batch-1 inference."""
        wake_ns = NEVER
        allowed, wake = self._cut(device, chosen, now_ns, batches)
        wake_ns = min(wake_ns, wake)
        if allowed is None:
            for other in sorted(choices):
                if other is chosen:
                    continue
                allowed, wake = self._cut(device, other, now_ns, batches)
                wake_ns = min(wake_ns, wake)
                if allowed is not None:
                    break
        return allowed, wake_ns

    def _cut(
        self, device: DeviceState, chosen: Choice, now_ns: int, batches: BatchPlanner
    ) -> tuple[Choice | None, int]:
        """``chosen`` cut to what the cap allows on ``device`` (None: run nothing yet), and when a batch-1
        inference would fit if the lane's booking is what stops it (else ``NEVER``)."""
        cap = self.cap_ns(device, chosen.model, chosen.start_ns, now_ns)
        if cap is None or chosen.exec_ns <= cap:
            return chosen, NEVER
        single = self.state.shapes.fastest_ns(chosen.model, device.kind)
        if cap < single:
            if cap + max(0, chosen.start_ns - now_ns) >= single:
                return None, now_ns + single - cap
            return None, NEVER
        if chosen.skip:  # a backlog kept whole: not cut from another head
            return None, NEVER
        smaller = batches.batch_within_head(device, chosen.model, chosen.start_ns, chosen.start_ns + cap)
        return (smaller if smaller is not None and smaller.slack_ns >= 0 else None), NEVER

    def _held_elsewhere(self, model: str, responsive: frozenset[int]) -> bool:
        return any(d not in responsive for d in self.state.residency.holders.get(model, ()))

    def homeless(self, now_ns: int) -> list[tuple[str, frozenset[int]]]:
        """Tight models, with the responsive devices that do not hold them yet."""
        plan = self.plan(now_ns)
        holders = self.state.residency.holders
        wanted = []
        for model in sorted(plan.tight):
            if model not in self._slo_of:
                continue
            missing = plan.responsive - holders.get(model, set())
            if missing:
                wanted.append((model, frozenset(missing)))
        return wanted

    def _work_out(self, now_ns: int) -> GuardPlan:
        rate = self.state.demand.arrivals_per_ns
        active = {m: slo for m, slo in self._slo_of.items() if rate(m, now_ns) > ACTIVE_PER_NS}
        if len(set(active.values())) < 2:
            return NO_PLAN
        kinds = self.state.residency.kinds

        def fastest(model: str) -> int:  # on the fastest kind: where the tight class is best served
            return min(self.state.shapes.fastest_ns(model, k) for k in kinds)

        by_slo = sorted(active.items(), key=lambda item: (-item[1], item[0]))
        longest_so_far, longest = 0, []  # the longest batch among models with at least this SLO
        for model, _ in by_slo:
            longest_so_far = max([longest_so_far] + [self._longest_ns(model, k) for k in kinds])
            longest.append(longest_so_far)
        descending = [-slo for _, slo in by_slo]
        tight: dict[str, tuple[int, int]] = {}
        for model, slo in by_slo:
            looser = bisect.bisect_right(descending, -CLASS_RATIO * slo)  # models of a looser class
            if not looser:
                continue
            single = fastest(model)
            slack = slo - self._margin_ns - single
            wait = slack - (self._room - 1) * single
            if slack > 0 and longest[looser - 1] > wait:
                tight[model] = (slack, wait)
        if not tight:
            return NO_PLAN
        work = sum(rate(m, now_ns) * fastest(m) for m in tight)
        devices = self.state.residency.devices
        count = min(len(devices), max(1, math.ceil(work / self._utilization)))
        previous = self._plan.responsive

        def rank(device: DeviceState) -> tuple[bool, int, int]:  # the same devices stay, then those holding most
            held = sum(1 for m in tight if m in device.ready_ns)
            return (device.spec.device not in previous, -held, device.spec.device)

        responsive = frozenset(d.spec.device for d in sorted(devices, key=rank)[:count])
        return GuardPlan(tight, responsive)

    def _longest_ns(self, model: str, kind: str) -> int:
        return self.state.shapes.exec_ns(model, self.state.shapes.sizes(model)[-1], kind)


class NoTightClassGuard:
    """The guard switched off (``guard_tight=false``): no model is tight, every batch runs whole."""

    guarding = False

    def saw(self, model: str, slo_ns: int) -> None:
        pass

    def forget(self, model: str) -> None:
        pass

    def reset(self) -> None:
        pass

    def plan(self, now_ns: int) -> GuardPlan:
        return NO_PLAN

    def homeless(self, now_ns: int) -> list[tuple[str, frozenset[int]]]:
        return []

    def allow(
        self, device: DeviceState, chosen: Choice, choices: list[Choice], now_ns: int, batches: BatchPlanner
    ) -> tuple[Choice | None, int]:
        return chosen, NEVER
