"""A batch that failed on its device: each request is run alone while its deadline allows
(``Infer.deadlines_ns``), so that only those whose own input fails get the error (``ActionResult.failed``);
those its deadline left no time to run alone are ``unchecked`` and get the batch's. The model is at fault
(an ``ERROR`` for the whole batch) when every request run alone fails, more than one of them, or a lone one
before the model has served any input."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mainspring.protocol import ActionResult, ActionStatus, Infer, Timing
from mainspring.protocol.tensors import Sample
from mainspring.time import Clock
from mainspring.worker.runtimes.cuda_graphs import is_sticky_cuda_error


@dataclass
class RunAlone:
    """What running a failed batch's requests one at a time found (``outputs``: one per request, empty for
    those ``failed`` or ``unchecked``)."""

    message: str  # the batch's error
    timing: Timing
    outputs: list[object]
    failed: dict[int, str]
    unchecked: tuple[int, ...]

    @property
    def ran(self) -> int:
        return len(self.outputs) - len(self.unchecked)

    @property
    def any_answered(self) -> bool:
        """Some request ran alone without failing: the model serves some input."""
        return len(self.failed) < self.ran

    def result(self, action: Infer, served_before: bool) -> ActionResult:
        """The batch's result; ``served_before``: the model has answered some input on this device."""
        if self.ran and len(self.failed) == self.ran and (self.ran > 1 or not served_before):
            return ActionResult(action.action_id, action.device, ActionStatus.ERROR, self.timing, self.message)
        return ActionResult(action.action_id, action.device, ActionStatus.OK, self.timing, self.message,
                            self.outputs, self.failed, self.unchecked)  # fmt: skip


def run_alone(
    action: Infer, samples: Sequence[Sample], error: Exception, run_one: Callable[[Sample], object], clock: Clock
) -> RunAlone:
    """Each of the failed batch's ``samples`` through ``run_one`` while its deadline allows (how long one
    takes alone: the longest so far, the batch's expected duration before any). A CUDA error that lost the
    context is raised: nothing runs any more."""
    begin = clock.now_ns()
    message = f"{type(error).__name__}: {error}"
    outputs: list[object] = []
    failed: dict[int, str] = {}
    unchecked: list[int] = []
    longest_alone: int | None = None
    for index, sample in enumerate(samples):
        outputs.append({})
        if len(samples) == 1:  # it has just failed alone
            failed[index] = message
            break
        started = clock.now_ns()
        alone_ns = action.expected_duration_ns if longest_alone is None else longest_alone
        if action.deadlines_ns and started + alone_ns > action.deadlines_ns[index]:
            unchecked.append(index)
            continue
        try:
            outputs[-1] = run_one(sample)
        except Exception as alone:
            if is_sticky_cuda_error(alone):
                raise
            failed[index] = f"{type(alone).__name__}: {alone}"
        longest_alone = max(longest_alone or 0, clock.now_ns() - started)
    return RunAlone(message, Timing(begin, clock.now_ns()), outputs, failed, tuple(unchecked))
