"""An executor lane: one thread running one action at a time, in order of ``earliest_ns``.

The lane waits for an action's window to open, refuses it without running when the
window has closed (``TOO_LATE``) or opens too far ahead (``TOO_EARLY``), and otherwise
hands it to the runtime. Every action submitted gets exactly one result.

Work that belongs to no action (capturing a loaded model's CUDA graphs) is given with
``when_idle``: it runs, a piece at a time, only while no action is due within ``idle_gap_ns``,
so an action submitted meanwhile waits for at most one piece of it.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

from mainspring.protocol import Action, ActionResult, ActionStatus
from mainspring.protocol.results import window_refusal
from mainspring.time import NS_PER_S, Clock

log = logging.getLogger(__name__)

RunAction = Callable[[Action, Any], ActionResult]
ResultSink = Callable[[ActionResult], None]


class Lane:
    """A thread with a queue ordered by ``earliest_ns``; ``run`` does the work and returns the result."""

    def __init__(
        self,
        name: str,
        clock: Clock,
        run: RunAction,
        sink: ResultSink,
        max_wait_ns: int = 10 * NS_PER_S,
        on_thread_start: Callable[[], None] | None = None,
        idle_gap_ns: int = 0,
    ) -> None:
        self.name = name
        self._clock = clock
        self._run = run
        self._sink = sink
        self._max_wait_ns = max_wait_ns
        self._on_thread_start = on_thread_start
        self._idle_gap_ns = idle_gap_ns
        self._queue: list[tuple[int, int, Action, Any]] = []
        self._idle_work: collections.deque[Callable[[], None]] = collections.deque()
        self._idle_running = False
        self._seq = itertools.count()
        self._wakeup = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, action: Action, payload: Any = None) -> None:
        with self._wakeup:
            if self._closed:
                raise RuntimeError(f"lane {self.name} is closed")
            heapq.heappush(self._queue, (action.earliest_ns, next(self._seq), action, payload))
            self._wakeup.notify()

    def when_idle(self, work: Callable[[], None]) -> None:
        """Run ``work`` on this lane's thread once no action is due (after the idle work given before it)."""
        with self._wakeup:
            self._idle_work.append(work)
            self._wakeup.notify()

    def wait_for_idle_work(self, timeout_s: float) -> bool:
        """Wait until no idle work is queued or running; False if some still is after ``timeout_s``."""
        with self._wakeup:
            return self._wakeup.wait_for(lambda: not self._idle_work and not self._idle_running, timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop after the running action; queued ones are answered with an error."""
        with self._wakeup:
            self._closed = True
            self._wakeup.notify()
        self._thread.join(timeout_s)

    def _next(self) -> tuple[Action, Any, ActionResult | None] | Callable[[], None] | None:
        """The next action to run (with no result), or one to refuse (with its result), or idle work when no
        action is due; None when closed."""
        with self._wakeup:
            while True:
                if self._closed:
                    return None
                if not self._queue:
                    if self._idle_work:
                        self._idle_running = True
                        return self._idle_work.popleft()
                    self._wakeup.wait()
                    continue
                earliest, _, action, payload = self._queue[0]
                now = self._clock.now_ns()
                refusal = window_refusal(action, now, self._max_wait_ns)
                if refusal is not None:
                    heapq.heappop(self._queue)
                    return action, payload, refusal
                if earliest > now:
                    if self._idle_work and earliest - now >= self._idle_gap_ns:
                        self._idle_running = True
                        return self._idle_work.popleft()
                    self._wakeup.wait((earliest - now) / NS_PER_S)
                    continue
                heapq.heappop(self._queue)
                return action, payload, None

    def _loop(self) -> None:
        if self._on_thread_start is not None:
            self._on_thread_start()
        while (item := self._next()) is not None:
            if callable(item):
                try:
                    item()
                except Exception:  # idle work answers nobody: its failure is only logged
                    log.exception("lane %s: idle work failed", self.name)
                with self._wakeup:
                    self._idle_running = False
                    self._wakeup.notify_all()
                continue
            action, payload, result = item
            if result is None:
                try:
                    result = self._run(action, payload)
                except Exception as error:  # a runtime bug must still answer the action
                    log.exception("lane %s: action %d failed", self.name, action.action_id)
                    result = ActionResult(action.action_id, action.device, ActionStatus.ERROR, None, repr(error))
            self._deliver(result)
        with self._wakeup:
            left, self._queue = self._queue, []
        for _, _, action, _ in left:
            self._deliver(ActionResult(action.action_id, action.device, ActionStatus.ERROR, None, "worker shut down"))

    def _deliver(self, result: ActionResult) -> None:
        try:
            self._sink(result)
        except Exception:
            log.exception("lane %s: result sink failed for action %d", self.name, result.action_id)
