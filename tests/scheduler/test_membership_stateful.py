"""Devices and models come and go while requests and results flow (hypothesis state machine).

A fake worker per device keeps what is resident (loads that reported, less evictions and
unloads) and answers actions in order, sometimes refusing. Invariants: every request is
answered exactly once, pages on a device never exceed its pool, no infer is sent for a
model that is not resident there, and a late result of a removed (or removed and added
again) model is taken quietly.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mainspring.protocol import (
    Action,
    ActionResult,
    ActionStatus,
    DeviceSpec,
    EvictWeights,
    Infer,
    LoadWeights,
    Timing,
)
from mainspring.scheduler.base import Membership, Scheduler
from mainspring.scheduler.registry import make_scheduler
from mainspring.time import NS_PER_MS, NS_PER_S
from tests.fakes import PAGE, profile, request

MS = NS_PER_MS
POOL_PAGES = 8
MODELS = {name: profile(name, pages=pages) for name, pages in (("a", 2), ("b", 3), ("c", 4), ("d", 2))}


class _FakeDevice:
    def __init__(self) -> None:
        self.resident: dict[str, int] = {}  # model -> pages, as the worker sees it
        self.loading: dict[int, str] = {}  # load action -> model
        self.pending: list[Action] = []


class MembershipMachine(RuleBasedStateMachine):
    policy_name = "clockwork"

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.next_request = 0
        self.next_device = 2
        self.models = {"a", "b"}
        self.devices = {0: _FakeDevice(), 1: _FakeDevice()}
        specs = [DeviceSpec(d, "v100", POOL_PAGES * PAGE, PAGE) for d in self.devices]
        policy = make_scheduler(self.policy_name, {m: MODELS[m] for m in self.models}, specs, random.Random(0))
        assert isinstance(policy, Membership)
        self.policy: Scheduler = policy
        self.members: Membership = policy
        self.asked: set[int] = set()
        self.answered: set[int] = set()

    # --- the harness ------------------------------------------------------------------
    def step(self) -> None:
        decisions = self.policy.schedule(self.now)
        for response in decisions.responses:
            assert response.request_id in self.asked, f"answer to unknown request {response.request_id}"
            assert response.request_id not in self.answered, f"request {response.request_id} answered twice"
            self.answered.add(response.request_id)
        for action in decisions.actions:
            device = self.devices[action.device]
            if isinstance(action, Infer):
                assert action.model in device.resident, f"infer on a model not resident: {action}"
            elif isinstance(action, LoadWeights):
                device.loading[action.action_id] = action.model
            elif isinstance(action, EvictWeights):
                device.resident.pop(action.model, None)
            device.pending.append(action)
        for device in self.devices.values():
            used = sum(device.resident.values()) + sum(MODELS[m].pages(PAGE) for m in device.loading.values())
            assert used <= POOL_PAGES, f"pages over the pool: {used}"

    def deliver(self, device_id: int, status: ActionStatus) -> None:
        device = self.devices[device_id]
        action = device.pending.pop(0)
        if isinstance(action, LoadWeights):
            model = device.loading.pop(action.action_id, None)  # None: the model was unloaded meanwhile
            if status is ActionStatus.OK and model is not None:
                device.resident[model] = MODELS[model].pages(PAGE)
        if status is ActionStatus.OK or (status is ActionStatus.ERROR and isinstance(action, Infer)):
            duration = max(1, action.expected_duration_ns)
            timing = Timing(self.now - duration, self.now) if status is ActionStatus.OK else None
            result = ActionResult(action.action_id, device_id, status, timing, "boom" if timing is None else "")
        else:
            result = ActionResult(action.action_id, device_id, status)
        self.policy.on_result(result, self.now)

    # --- rules ------------------------------------------------------------------------------
    @rule(model=st.sampled_from([*sorted(MODELS), "zzz"]), slo_ms=st.sampled_from([5, 20, 100, 500]))
    def arrive(self, model: str, slo_ms: int) -> None:
        self.next_request += 1
        self.asked.add(self.next_request)
        self.policy.on_request(request(self.next_request, model, self.now, slo_ms=slo_ms), self.now)
        self.step()

    @rule(ms=st.integers(0, 30))
    def advance(self, ms: int) -> None:
        self.now += ms * MS
        self.step()

    @precondition(lambda self: any(d.pending for d in self.devices.values()))
    @rule(data=st.data(), status=st.sampled_from([ActionStatus.OK] * 4 + [ActionStatus.TOO_LATE, ActionStatus.ERROR]))
    def finish(self, data: st.DataObject, status: ActionStatus) -> None:
        busy = sorted(d for d, device in self.devices.items() if device.pending)
        self.now += 1 * MS
        self.deliver(data.draw(st.sampled_from(busy)), status)
        self.step()

    @precondition(lambda self: len(self.devices) < 4)
    @rule(data=st.data())
    def join(self, data: st.DataObject) -> None:
        # It may already hold weights (a worker rejoining a restarted controller): any served models that fit.
        self.add_device(data.draw(st.lists(st.sampled_from(sorted(self.models)), unique=True)) if self.models else [])

    def add_device(self, held: list[str] | None = None) -> None:
        device = self.devices[self.next_device] = _FakeDevice()
        for model in held or []:
            if sum(device.resident.values()) + MODELS[model].pages(PAGE) <= POOL_PAGES:
                device.resident[model] = MODELS[model].pages(PAGE)
        spec = DeviceSpec(self.next_device, "v100", POOL_PAGES * PAGE, PAGE, resident=tuple(device.resident))
        self.members.add_device(spec)
        self.next_device += 1
        self.step()

    @precondition(lambda self: len(self.devices) > 0)
    @rule(data=st.data())
    def remove_device(self, data: st.DataObject) -> None:
        self.drop_device(data.draw(st.sampled_from(sorted(self.devices))))

    def drop_device(self, device: int) -> None:
        del self.devices[device]  # its results never come
        self.members.remove_device(device, self.now)
        self.step()

    @rule(model=st.sampled_from(sorted(MODELS)))
    def add_or_remove_model(self, model: str) -> None:
        if model in self.models:
            self.models.discard(model)
            self.members.remove_model(model, self.now)
            for device in self.devices.values():  # the workers drop its weights themselves
                device.resident.pop(model, None)
                device.loading = {a: m for a, m in device.loading.items() if m != model}
        else:
            self.models.add(model)
            self.members.add_model(MODELS[model])
        self.step()

    @invariant()
    def nothing_answered_that_was_not_asked(self) -> None:
        assert self.answered <= self.asked

    def finish_everything(self) -> None:
        for _ in range(1000):
            busy = [d for d, device in self.devices.items() if device.pending]
            if not busy:
                return
            self.now += 1 * MS
            self.deliver(busy[0], ActionStatus.OK)
            self.step()

    def teardown(self) -> None:
        """Finish every action and let every deadline pass: every request has its one answer."""
        self.finish_everything()
        self.now += 10 * NS_PER_S
        self.step()
        self.finish_everything()
        assert self.answered == self.asked, f"never answered: {sorted(self.asked - self.answered)[:10]}"


def _machine(policy: str) -> type[MembershipMachine]:
    return type(f"{policy.title()}Membership", (MembershipMachine,), {"policy_name": policy})


_SETTINGS = settings(max_examples=40, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck))
TestClockworkMembership = _SETTINGS(_machine("clockwork")).TestCase
TestInfer4Membership = _SETTINGS(_machine("infer4")).TestCase
TestTritonMembership = _SETTINGS(_machine("triton")).TestCase
TestClipperMembership = _SETTINGS(_machine("clipper")).TestCase


def test_infer4_a_load_for_a_removed_model_does_not_count_for_its_next_residency() -> None:
    """Found by this machine on a CI run: ``b`` removed and added again while its load was in flight;
    the old load's result made INFER4 take ``b`` for loaded and plan an infer the worker could not run."""
    state = _machine("infer4")()
    state.add_device()
    state.add_device()
    state.arrive(model="b", slo_ms=5)
    state.advance(ms=1)
    state.add_or_remove_model(model="b")
    state.add_or_remove_model(model="b")
    state.arrive(model="b", slo_ms=5)
    state.advance(ms=1)
    state.teardown()


def test_a_reactive_policy_uses_the_copy_a_rejoining_worker_holds() -> None:
    """Found by this machine in a `make test` run (triton and clipper alike): device 3 rejoins holding ``c`` and
    ``d`` while their placements point at devices that then leave. The policy loaded ``d`` again on
    device 3, counting its pages twice, and then found no room for ``c``: its request was never answered."""
    for policy in ("triton", "clipper"):
        state = _machine(policy)()
        state.add_or_remove_model(model="c")
        state.add_or_remove_model(model="d")
        state.arrive(model="d", slo_ms=5)  # its load goes to device 0 or 1
        state.add_device(["c"])  # device 2: ``c`` placed there
        state.add_device(["c", "d"])  # device 3: copies kept, unused
        for device in (0, 1, 2):
            state.drop_device(device)
        state.arrive(model="c", slo_ms=5)
        assert not any(isinstance(a, LoadWeights) for a in state.devices[3].pending), "a held copy loaded again"
        state.teardown()  # every request answered
