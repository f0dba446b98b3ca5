"""The last seconds of every device's lanes, for the live page (``GET /dashboard``).

A ``ControllerObserver``: each action from the moment it is sent (in flight: its planned
window) until it reports (ran: its measured begin and end beside the window the controller
predicted; refused: when and why), every request that missed its SLO (rejected, expired, failed
or late), and which models each device holds (loaded, until an eviction is sent). Actions and
misses are kept for ``horizon_s`` and at most ``max_items`` of each, as the logs' rows
(``telemetry.recorder``), so memory stays bounded under any load and the last few misses are
explained by ``mainspring analyze``'s own rules (``telemetry.analyze``) when the page asks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from mainspring.protocol import Action, ActionResult, EvictWeights, Request, Response, ResponseStatus, action_kind
from mainspring.telemetry.analyze import cause_of, detail_of, loads_and_holdings
from mainspring.telemetry.recorder import ActionRow, RequestRow, action_row, as_text, request_row
from mainspring.time import NS_PER_MS, NS_PER_S

EXPLAINED = 8  # the last misses the page explains


class Timeline:
    def __init__(self, horizon_s: float = 30.0, max_items: int = 20_000) -> None:
        self._horizon_ns = round(horizon_s * NS_PER_S)
        self._sent: dict[int, tuple[Action, int]] = {}
        self._rows: deque[ActionRow] = deque(maxlen=max_items)
        self._misses: deque[RequestRow] = deque(maxlen=max_items)
        self.held: dict[int, dict[str, int]] = {}  # device -> model key -> held since (ns)

    def add_device(self, device: int, resident: Iterable[str], now_ns: int) -> None:
        """A device joined holding ``resident`` already (a worker rejoining keeps its weights)."""
        self.held[device] = dict.fromkeys(resident, now_ns)

    def remove_device(self, device: int) -> None:
        self.held.pop(device, None)

    # --- ControllerObserver -------------------------------------------------------------
    def on_request(self, request: Request, now_ns: int) -> None:
        pass

    def on_action(self, action: Action, now_ns: int) -> None:
        self._sent[action.action_id] = (action, now_ns)
        if isinstance(action, EvictWeights):  # its room counts as free from now (as ``analyze`` reads it)
            self.held.get(action.device, {}).pop(action.model, None)

    def on_result(self, result: ActionResult, action: Action, now_ns: int) -> None:
        _, sent_ns = self._sent.pop(action.action_id, (action, now_ns))
        row = action_row(action, sent_ns, result, now_ns)
        self._rows.append(row)
        if result.ok and row.kind == "load" and action.device in self.held:
            self.held[action.device][action.model] = row.end_ns
        self._forget_before(now_ns - self._horizon_ns)

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        if response.status is not ResponseStatus.SUCCESS or now_ns > request.deadline_ns:
            self._misses.append(request_row(request, response, now_ns, cold=False))

    # --- the page's data ----------------------------------------------------------------
    def snapshot(self, now_ns: int, seconds: float, devices: Iterable[int] = ()) -> dict[str, Any]:
        """What happened in the last ``seconds`` on ``devices`` (the connected ones) and any device with
        actions in that time, times in ms relative to now (negative: past); the last misses explained."""
        since = now_ns - round(seconds * NS_PER_S)
        self._forget_before(now_ns - self._horizon_ns)
        for stale in [i for i, (_, sent) in self._sent.items() if sent < now_ns - self._horizon_ns]:
            del self._sent[stale]  # its device was lost: no result will come

        def ms(t: int) -> float:
            return round((t - now_ns) / NS_PER_MS, 3)

        actions = [_mark(row, ms) for row in self._rows if row.received_ns >= since]
        for action, sent in self._sent.values():  # in flight: where it was planned to run
            actions.append(_mark(_in_flight(action, sent, now_ns), ms))
        misses = [r for r in self._misses if r.answered_ns >= since]
        return {
            "seconds": seconds,
            "devices": sorted(set(devices) | {a["device"] for a in actions}),
            "actions": actions,
            "misses": [_miss(r, ms(r.answered_ns)) for r in misses],
            "explained": self.explain(misses[-EXPLAINED:], ms),
        }

    def explain(self, misses: list[RequestRow], ms: Callable[[int], float]) -> list[dict[str, Any]]:
        """Why each of ``misses`` missed, by ``mainspring analyze``'s rules over the actions kept, the latest first
        (``ms``: a time of the clock as the page shows it)."""
        wanted = {r.action_id for r in misses if r.action_id >= 0}
        kept = [row for row in self._rows if row.kind != "infer" or row.action_id in wanted]
        loads, holdings = loads_and_holdings(as_text(row) for row in kept if row.kind != "infer")
        served = {row.action_id: row for row in kept if row.kind == "infer"}
        actions = {i: as_text(row) for i, row in served.items()}
        explained = []
        for miss in reversed(misses):  # the latest first
            request = as_text(miss._replace(cold=_cold(miss, served.get(miss.action_id), kept)))
            cause = cause_of(request, actions, loads, holdings) or "met its SLO"
            detail = detail_of(request, actions)
            explained.append(_miss(miss, ms(miss.answered_ns)) | {"cause": cause, "detail": detail})
        return explained

    def _forget_before(self, cutoff_ns: int) -> None:
        while self._rows and self._rows[0].received_ns < cutoff_ns:
            self._rows.popleft()
        while self._misses and self._misses[0].answered_ns < cutoff_ns:
            self._misses.popleft()


def _miss(row: RequestRow, at: float) -> dict[str, Any]:
    outcome = row.outcome if row.status != ResponseStatus.SUCCESS.value else "late"
    return {"at_ms": at, "model": row.model, "outcome": outcome, "request_id": row.request_id}


def _cold(miss: RequestRow, infer: ActionRow | None, rows: list[ActionRow]) -> bool:
    """Served right after a load of its model on its device that ended after it arrived (the recorder's rule)."""
    if infer is None:
        return False
    ends = [r.end_ns for r in rows if r.kind == "load" and r.status == "ok" and r.device == infer.device
            and r.model == infer.model and r.received_ns <= infer.received_ns]  # fmt: skip
    return max(ends, default=-1) > miss.arrival_ns


def _planned(earliest_ns: int, sent_ns: int, expected_ns: int) -> tuple[int, int]:
    """Where the controller predicted an action would run: from when it could start, for its expected time."""
    begin = max(earliest_ns, sent_ns)
    return begin, begin + expected_ns


def _window(planned: tuple[int, int], ms: Callable[[int], float]) -> dict[str, float]:
    return {"predicted_begin_ms": ms(planned[0]), "predicted_end_ms": ms(planned[1])}


def _in_flight(action: Action, sent_ns: int, now_ns: int) -> ActionRow:
    begin, end = _planned(action.earliest_ns, sent_ns, action.expected_duration_ns)
    batch = getattr(action, "batch_size", 0)
    return ActionRow(action.action_id, action_kind(action), action.device, action.model, batch, 0, sent_ns,
                     action.earliest_ns, action.latest_ns, action.expected_duration_ns, "in_flight", begin, end,
                     now_ns, "")  # fmt: skip


def _mark(row: ActionRow, ms: Callable[[int], float]) -> dict[str, Any]:
    """One action on its lane: where it ran (refused: a sliver when it was refused), and where it was predicted to."""
    begin, end = (row.begin_ns, row.end_ns) if row.begin_ns >= 0 else (row.received_ns, row.received_ns)
    return {
        "device": row.device, "lane": "exec" if row.kind == "infer" else "load", "kind": row.kind,
        "model": row.model, "batch": row.batch_size, "begin_ms": ms(begin), "end_ms": ms(end),
        "status": row.status, "message": row.message,
    } | _window(_planned(row.earliest_ns, row.sent_ns, row.expected_ns), ms)  # fmt: skip
