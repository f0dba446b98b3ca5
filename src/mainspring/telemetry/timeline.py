"""The last seconds of every device's lanes, for the live page (``GET /dashboard``).

A ``ControllerObserver``: each action from the moment it is sent (in flight: its planned
window) until it reports (ran: its measured begin and end; refused: when and why), and every
request that missed its SLO (rejected, expired, failed or late), kept for ``horizon_s`` and at
most ``max_items`` of each, so memory stays bounded under any load.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mainspring.protocol import Action, ActionResult, Infer, Request, Response, ResponseStatus, action_kind
from mainspring.time import NS_PER_MS, NS_PER_S


@dataclass(slots=True)
class _Span:
    device: int
    lane: str  # "exec" (infers) or "load" (loads and evictions)
    kind: str
    model: str
    batch: int
    begin_ns: int
    end_ns: int
    status: str
    message: str = ""


class Timeline:
    def __init__(self, horizon_s: float = 30.0, max_items: int = 20_000) -> None:
        self._horizon_ns = round(horizon_s * NS_PER_S)
        self._sent: dict[int, tuple[Action, int]] = {}
        self._spans: deque[_Span] = deque(maxlen=max_items)
        self._misses: deque[tuple[int, str, str]] = deque(maxlen=max_items)  # answered at, model, outcome

    # --- ControllerObserver -------------------------------------------------------------
    def on_request(self, request: Request, now_ns: int) -> None:
        pass

    def on_action(self, action: Action, now_ns: int) -> None:
        self._sent[action.action_id] = (action, now_ns)

    def on_result(self, result: ActionResult, action: Action, now_ns: int) -> None:
        self._sent.pop(action.action_id, None)
        if result.timing is not None:
            begin, end = result.timing.begin_ns, result.timing.end_ns
        else:  # refused: it did not run; a sliver where it would have, to show when and why
            begin, end = now_ns, now_ns
        self._spans.append(_span(action, begin, end, result.status.value, result.message))
        self._forget_before(now_ns - self._horizon_ns)

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        if response.status is not ResponseStatus.SUCCESS or now_ns > request.deadline_ns:
            outcome = response.outcome.value if response.status is not ResponseStatus.SUCCESS else "late"
            self._misses.append((now_ns, request.model, outcome))

    # --- the page's data ----------------------------------------------------------------
    def snapshot(self, now_ns: int, seconds: float, devices: Iterable[int] = ()) -> dict[str, Any]:
        """What happened in the last ``seconds`` on ``devices`` (the connected ones) and any device with
        actions in that time, times in ms relative to now (negative: past)."""
        since = now_ns - round(seconds * NS_PER_S)
        self._forget_before(now_ns - self._horizon_ns)
        for stale in [i for i, (_, sent) in self._sent.items() if sent < now_ns - self._horizon_ns]:
            del self._sent[stale]  # its device was lost: no result will come

        def ms(t: int) -> float:
            return round((t - now_ns) / NS_PER_MS, 3)

        spans = [s for s in self._spans if s.end_ns >= since]
        for action, sent in self._sent.values():  # in flight: where it was planned to run
            start = max(action.earliest_ns, sent)
            spans.append(_span(action, start, start + action.expected_duration_ns, "in_flight"))
        actions = [
            {"device": s.device, "lane": s.lane, "kind": s.kind, "model": s.model, "batch": s.batch,
             "begin_ms": ms(s.begin_ns), "end_ms": ms(s.end_ns), "status": s.status, "message": s.message}
            for s in spans
        ]  # fmt: skip
        return {
            "seconds": seconds,
            "devices": sorted(set(devices) | {s.device for s in spans}),
            "actions": actions,
            "misses": [{"at_ms": ms(t), "model": m, "outcome": o} for t, m, o in self._misses if t >= since],
        }

    def _forget_before(self, cutoff_ns: int) -> None:
        while self._spans and self._spans[0].end_ns < cutoff_ns:
            self._spans.popleft()
        while self._misses and self._misses[0][0] < cutoff_ns:
            self._misses.popleft()


def _span(action: Action, begin_ns: int, end_ns: int, status: str, message: str = "") -> _Span:
    kind = action_kind(action)
    batch = action.batch_size if isinstance(action, Infer) else 0
    lane = "exec" if kind == "infer" else "load"
    return _Span(action.device, lane, kind, action.model, batch, begin_ns, end_ns, status, message)
