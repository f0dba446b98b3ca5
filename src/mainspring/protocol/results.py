"""What a worker reports back for every action it received."""

from __future__ import annotations

import enum

import msgspec

from mainspring.protocol.actions import Action


class ActionStatus(enum.Enum):
    OK = "ok"
    TOO_EARLY = "too_early"
    TOO_LATE = "too_late"
    NOT_RESIDENT = "not_resident"
    OUT_OF_MEMORY = "out_of_memory"
    ERROR = "error"


class Timing(msgspec.Struct, frozen=True):
    """When the work began and ended, on the worker's clock."""

    begin_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.begin_ns


class ActionResult(msgspec.Struct, frozen=True):
    """Outcome of one action. Failures travel as results, not exceptions.

    ``timing`` is present for every action that ran; a refused action has none.
    ``outputs`` (for ``Infer`` only) holds one entry per request, in batch order.
    ``failed`` (an ``Infer`` that ran OK) maps the batch positions whose own input failed when
    run alone to the model's message; ``unchecked`` are the positions not run alone because their
    deadline left no time (the batch failed: whether their input is at fault is unknown). Both
    have empty ``outputs`` entries.
    """

    action_id: int
    device: int
    status: ActionStatus
    timing: Timing | None = None
    message: str = ""
    outputs: list[object] | None = None
    failed: dict[int, str] | None = None
    unchecked: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status is ActionStatus.OK

    @property
    def isolated(self) -> bool:
        """The batch failed and ran again request by request: its timing is no measurement of the batch."""
        return bool(self.failed or self.unchecked)


def window_refusal(action: Action, now_ns: int, max_wait_ns: int) -> ActionResult | None:
    """What a lane answers instead of running ``action`` when it could start it at ``now_ns``:
    ``TOO_LATE`` once its latest start has passed, ``TOO_EARLY`` when its window opens more than
    ``max_wait_ns`` ahead; None when it may run now or wait for its window to open. The one rule
    of every lane, real (``worker/executor.py``) or emulated (``worker/runtimes/emulated.py``)."""
    if action.latest_ns < now_ns:
        late = f"window closed {(now_ns - action.latest_ns) / 1e6:.3f} ms before the lane was free"
        return ActionResult(action.action_id, action.device, ActionStatus.TOO_LATE, None, late)
    if action.earliest_ns > now_ns + max_wait_ns:
        early = f"window opens {(action.earliest_ns - now_ns) / 1e9:.1f} s ahead, more than the lane waits"
        return ActionResult(action.action_id, action.device, ActionStatus.TOO_EARLY, None, early)
    return None
