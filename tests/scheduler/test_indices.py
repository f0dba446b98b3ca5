"""The clockwork policy's indices change its cost, never its decisions.

The reference below finds due devices and the next wake-up by visiting every device, recomputes
every estimate, asks every holder whether a head is feasible before trying a batch, weighs a queue
of one request like any other (no lone path in ``BatchPlanner.weigh``), checks every stranded model that is not waiting
for a replica or cold on every pass (no ``SettledStrands``, no active set), and sorts every cold and
spill model for each load pass, as the policy did before the indices; seeded runs of both must give
byte-identical action and request logs over device counts, model counts, loads, SLOs and seeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.protocol import Request
from mainspring.scheduler.base import Scheduler
from mainspring.scheduler.clockwork import ClockworkScheduler
from mainspring.scheduler.clockwork.batching import BatchPlanner, Choice
from mainspring.scheduler.clockwork.loads import LoadPlanner, Tier, Tiers
from mainspring.scheduler.clockwork.queues import ModelQueue
from mainspring.scheduler.clockwork.shapes import BatchShapes
from mainspring.scheduler.clockwork.strands import StrandCheck
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.lanes import NEVER
from mainspring.scheduler.timed import TimedScheduler
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import NS_PER_S, ms_to_ns
from mainspring.workload import AzureTrace, PoissonOpenLoop, Workload


class ScanningDue:
    """``DueDevices`` by a scan of every device."""

    def __init__(self, policy: ClockworkScheduler, exec_lane: bool) -> None:
        self._policy = policy
        self._exec = exec_lane

    def moved(self, device: DeviceState) -> None:
        pass

    def _free(self, device: DeviceState) -> int:
        return device.exec_lane.free_ns if self._exec else device.load_lane.free_ns

    def due(self, limit_ns: int) -> list[DeviceState]:
        return [
            d for d in self._policy.residency.devices if (d.waiting or not self._exec) and self._free(d) <= limit_ns
        ]

    def any_due(self, limit_ns: int) -> bool:
        return bool(self.due(limit_ns))

    def next_after(self, after_ns: int, counts: object) -> int:
        found = [
            self._free(d)
            for d in self._policy.residency.devices
            if (d.waiting if self._exec else d.load_lane.busy) and self._free(d) > after_ns
        ]
        return min(found, default=NEVER)


class UncachedShapes(BatchShapes):
    def estimates(self, model: str, kind: str) -> tuple[tuple[tuple[int, int], ...], int]:
        table = self.table(model, kind)
        return table, min(ns for _, ns in table)


class SortingLoads(LoadPlanner):
    """Load planning with every cold and spill model sorted on every pass (no ``TierOrder``), and
    replica priorities weighed at every check (not skipped when no free device has room)."""

    def _replica_room(self, free: list[DeviceState], now_ns: int) -> bool:
        return True

    def _urgent(self) -> Tiers:
        cold = sorted((self._load_order_key(m), m) for m in self.state.residency.cold)
        spill = [m for m in self.state.demand.needs_replica if m in self.state.queues]
        return [(Tier.COLD, cold), (Tier.SPILL, sorted((self._load_order_key(m), m) for m in spill))]


class WeighingEveryQueue(BatchPlanner):
    def weigh(self, device: DeviceState, start_ns: int, now_ns: int) -> list[Choice]:
        choices = (self.best_batch(device, model, start_ns, now_ns) for model in sorted(device.waiting))
        return [choice for choice in choices if choice is not None]  # no inline lone path

    def best_batch(self, device: DeviceState, model: str, start_ns: int, now_ns: int) -> Choice | None:
        if model in device.loading:
            return None
        queue = self.state.queues[model]
        head: Request | None = self.state.feasible_head(queue, now_ns)
        if head is None:
            return None
        choice = self._batch_within(device, queue, head, start_ns, head.ready_by_ns)
        if self.config.whole_batches and choice is not None:
            choice = self._keep_backlog_whole(device, queue, start_ns, choice)
        return choice


class CheckingEveryStrand(StrandCheck):
    def spill(self, now_ns: int, after: float) -> None:
        stranded, needs_replica = self.stranded, self._needs_replica
        stranded.update(self.state.queues.newly_stranded(now_ns))
        for model in stranded.difference(needs_replica, self.state.residency.cold):  # no active set: every one
            queue = self.state.queues.get(model)
            head = None if queue is None else queue.head()
            if queue is None or head is None or now_ns - head.arrival_ns <= after * head.slo_ns:
                stranded.discard(model)
                continue
            holders = self.state.residency.holding(model)
            if self._replicas_on_the_way_cover(model, queue, head, holders, now_ns):
                continue
            if any(device.exec_lane.free_ns > now_ns for device in holders):
                needs_replica.add(model)

    def _replicas_on_the_way_cover(
        self, model: str, queue: ModelQueue, head: Request, holders: tuple[DeviceState, ...], now_ns: int
    ) -> bool:
        room = sum(
            self.state.shapes.largest_batch_by(
                model, d.kind, max(now_ns, d.exec_lane.free_ns, d.ready_ns[model]), head.ready_by_ns
            )
            for d in holders
            if model in d.loading
        )
        return room >= queue.count  # never set aside: every stranded model is checked on every pass


def as_reference(timed: Scheduler) -> Scheduler:
    assert isinstance(timed, TimedScheduler)
    policy = timed.inner
    assert isinstance(policy, ClockworkScheduler)
    policy.batches.__class__ = WeighingEveryQueue
    policy.strands.__class__ = CheckingEveryStrand
    policy.shapes.__class__ = UncachedShapes
    policy.loads.__class__ = SortingLoads
    residency = policy.residency
    residency.exec_due = ScanningDue(policy, exec_lane=True)  # type: ignore[assignment]
    residency.load_due = ScanningDue(policy, exec_lane=False)  # type: ignore[assignment]
    return timed


def logs(tmp_path: Path, workload: Workload, config: SimulationConfig, copies: int, reference: bool) -> bytes:
    models = model_copies(builtin_profiles(), copies)
    result = simulate("clockwork", models, workload, config, wrap=as_reference if reference else None)
    name = "reference" if reference else "indexed"
    requests, actions = result.recorder.write_logs(tmp_path / name, name)
    return actions.read_bytes() + requests.read_bytes()


@settings(max_examples=12, deadline=None)
@given(
    devices=st.integers(1, 12),
    copies=st.sampled_from([5, 30, 120, 400]),
    rate_per_device=st.sampled_from([50.0, 250.0, 600.0]),
    slo_ms=st.sampled_from([10, 25, 100, 500]),
    seed=st.integers(0, 1000),
    zipf=st.booleans(),
    latency_ms=st.sampled_from([0.0, 0.0, 0.5, 2.0]),  # the deadline margin planned for
)
def test_indexed_policy_decides_as_the_scanning_reference(
    tmp_path_factory: pytest.TempPathFactory,
    devices: int,
    copies: int,
    rate_per_device: float,
    slo_ms: int,
    seed: int,
    zipf: bool,
    latency_ms: float,
) -> None:
    tmp_path = tmp_path_factory.mktemp("indices")
    workload = PoissonOpenLoop(rate_per_device * devices, "zipf" if zipf else "uniform")
    latency = ms_to_ns(latency_ms)
    config = SimulationConfig(NS_PER_S, devices, seed=seed, slo_ns=ms_to_ns(slo_ms), network_latency_ns=latency)
    indexed = logs(tmp_path, workload, config, copies, reference=False)
    assert indexed.count(b"\n") > 10
    assert indexed == logs(tmp_path, workload, config, copies, reference=True)


def test_indexed_policy_decides_as_the_reference_on_a_trace_with_loads_and_evictions(tmp_path: Path) -> None:
    config = SimulationConfig(duration_ns=10 * NS_PER_S, devices=3, pool_bytes=2 * 1024**3, seed=7)
    indexed = logs(tmp_path, AzureTrace(scale=30), config, 300, reference=False)
    assert b"evict" in indexed and b"load" in indexed
    assert indexed == logs(tmp_path, AzureTrace(scale=30), config, 300, reference=True)
