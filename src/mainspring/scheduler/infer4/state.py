"""INFER4's queued requests, per-model queues and per-device state, which INFER5 shares."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field

from mainspring.protocol import DeviceSpec, Request
from mainspring.scheduler.infer4.demand import Demand
from mainspring.scheduler.lanes import NEVER, LaneTracker


@dataclass(slots=True)
class QueuedRequest:
    request: Request
    seq: int  # arrival order within the model
    deadline_ns: int  # the scheduling deadline (buffer applied)
    demand: Demand


@dataclass(slots=True)
class ModelQueue:
    queue: deque[QueuedRequest] = field(default_factory=deque)
    next_seq: int = 0


@dataclass(slots=True)
class Infer4Device:
    spec: DeviceSpec
    exec_lane: LaneTracker = field(default_factory=LaneTracker)
    load_lane: LaneTracker = field(default_factory=LaneTracker)
    strategies: list[tuple[int, int, int, str, int]] = field(default_factory=list)  # priority, seq, batch, model, at
    loaded: set[str] = field(default_factory=set)
    loading: dict[str, int] = field(default_factory=dict)  # model -> its load's action id
    busy: dict[str, int] = field(default_factory=dict)  # models with infers in flight -> count
    free_pages: int = 0
    loads_in_flight: int = 0
    last_load_ns: int = -NEVER
    load_wanted: bool = True  # the tracker may have a model for this device (False: it said none)

    def __post_init__(self) -> None:
        self.free_pages = self.spec.total_pages


def position_of(queue: deque[QueuedRequest], seq: int) -> int | None:
    """Index of the request with arrival number ``seq`` in a queue kept in arrival order."""
    index = bisect_left(queue, seq, key=arrival_seq)
    return index if index < len(queue) and queue[index].seq == seq else None


def arrival_seq(queued: QueuedRequest) -> int:
    """A queued request's arrival number within its model (the key queues are kept in order by)."""
    return queued.seq
