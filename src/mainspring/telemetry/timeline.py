"""The last seconds of every device's lanes, for the live page (``GET /dashboard``).

A ``ControllerObserver``: each action from the moment it is sent (in flight: its planned
window) until it reports (its row of the action log, ``telemetry.recorder``: the window the
controller predicted beside when it ran, or when and why it was refused), the last requests that
missed their SLO (rejected, expired, failed or late), and which models each device holds (loaded,
until an eviction is sent). Actions are kept for ``horizon_s`` and at most ``max_items``, so
memory stays bounded under any load. The page asks for what came since its last poll (rows as they
are, no copy made per poll), and the last misses are explained once each, by ``mainspring
analyze``'s own rules (``telemetry.analyze``).
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Iterable
from typing import Any

from mainspring.protocol import Action, ActionResult, EvictWeights, Outcome, Request, Response, action_kind
from mainspring.telemetry.analyze import cause_of, detail_of, loads_and_holdings
from mainspring.telemetry.recorder import ActionRow, RequestRow, action_row, as_text, request_row
from mainspring.time import NS_PER_S

EXPLAINED = 8  # the last misses the page explains
SEARCHED = 2_000  # actions back from a late answer searched for the batch that served it
SERVED = Outcome.SERVED  # per answer: a module's name is read in half the time of an enum member


class Timeline:
    def __init__(self, horizon_s: float = 30.0, max_items: int = 20_000) -> None:
        self._horizon_ns = round(horizon_s * NS_PER_S)
        self._sent: dict[int, tuple[Action, int]] = {}
        self._rows: deque[ActionRow] = deque(maxlen=max_items)  # in the order they reported
        self._loads: deque[ActionRow] = deque(maxlen=max_items)  # loads and evictions, also among the rows
        self._misses: deque[RequestRow] = deque(maxlen=EXPLAINED)
        self._explained: dict[int, dict[str, Any]] = {}  # request id -> why (of the misses kept)
        self.held: dict[int, dict[str, int]] = {}  # device -> model key -> held since (ns)

    def add_device(self, device: int, resident: Iterable[str], now_ns: int) -> None:
        """A device joined holding ``resident`` already (a worker rejoining keeps its weights)."""
        self.held[device] = dict.fromkeys(resident, now_ns)

    def remove_device(self, device: int) -> None:
        """The device is gone: what it held, and its actions in flight (no result will come for them)."""
        self.held.pop(device, None)
        self._sent = {i: sent for i, sent in self._sent.items() if sent[0].device != device}

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
        if row.kind != "infer":
            self._loads.append(row)
            if result.ok and row.kind == "load" and action.device in self.held:
                self.held[action.device][action.model] = row.end_ns
        self._forget_before(now_ns - self._horizon_ns)

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        if response.outcome is not SERVED or now_ns > request.deadline_ns:
            self._misses.append(request_row(request, response, now_ns, cold=False))

    # --- the page's data ----------------------------------------------------------------
    def view(self, now_ns: int, since_ns: int, devices: Iterable[int] = ()) -> dict[str, Any]:
        """The actions that reported after ``since_ns`` (the action log's rows), those in flight (rows with
        status ``in_flight``, begin and end where they were planned), ``devices`` (the connected ones) and
        any with actions in that time, and the last misses explained (the latest first)."""
        self._forget_before(now_ns - self._horizon_ns)
        first = bisect.bisect_right(self._rows, since_ns, key=lambda row: row.received_ns)
        actions = list(itertools.islice(reversed(self._rows), len(self._rows) - first))[::-1]
        in_flight = [_in_flight(action, sent) for action, sent in self._sent.values()]
        return {
            "devices": sorted(set(devices) | {a.device for a in actions} | {a.device for a in in_flight}),
            "actions": actions,
            "in_flight": in_flight,
            # Within the horizon only: older ones' actions are forgotten, and they would be explained without them.
            "explained": [
                self._explain(m) for m in reversed(self._misses) if m.answered_ns >= now_ns - self._horizon_ns
            ],
        }

    def _explain(self, miss: RequestRow) -> dict[str, Any]:
        """Why ``miss`` missed, by ``mainspring analyze``'s rules over the actions kept; worked out once."""
        found = self._explained.get(miss.request_id)
        if found is None:
            kept = {m.request_id for m in self._misses}
            self._explained = {i: e for i, e in self._explained.items() if i in kept}
            loads = [row for row in self._loads if row.model == miss.model]
            infer = self._served(miss)
            cold = infer is not None and _loaded_after_arrival(miss, infer, loads)
            request = as_text(miss) | {"cold": "1" if cold else "0"}  # as the request log writes it
            actions = {} if infer is None else {infer.action_id: as_text(infer)}
            made, holdings = loads_and_holdings(as_text(row) for row in loads)
            for device, models in self.held.items():  # held from before the rows kept: a load they do not show
                if miss.model in models:
                    since = str(models[miss.model])
                    holdings.record({"kind": "load", "model": miss.model, "device": str(device), "end_ns": since})
            outcome = miss.outcome if miss.outcome != Outcome.SERVED.value else "late"
            found = self._explained[miss.request_id] = {
                "request_id": miss.request_id, "model": miss.model, "answered_ns": miss.answered_ns,
                "outcome": outcome, "cause": cause_of(request, actions, made, holdings) or "met its SLO",
                "detail": detail_of(request, actions),
            }  # fmt: skip
        return found

    def _served(self, miss: RequestRow) -> ActionRow | None:
        """The batch that served ``miss`` (one that reported shortly before it was answered), if kept."""
        if miss.action_id < 0:
            return None
        last = bisect.bisect_right(self._rows, miss.answered_ns, key=lambda row: row.received_ns)
        for i in range(last - 1, max(-1, last - 1 - SEARCHED), -1):
            if self._rows[i].action_id == miss.action_id:
                return self._rows[i]
        return None

    def _forget_before(self, cutoff_ns: int) -> None:
        for rows in (self._rows, self._loads):
            while rows and rows[0].received_ns < cutoff_ns:
                rows.popleft()


def _loaded_after_arrival(miss: RequestRow, infer: ActionRow, loads: list[ActionRow]) -> bool:
    """Served right after a load of its model on its device that ended after it arrived (the recorder's rule)."""
    ends = [r.end_ns for r in loads if r.kind == "load" and r.status == "ok" and r.device == infer.device
            and r.received_ns <= infer.received_ns]  # fmt: skip
    return max(ends, default=-1) > miss.arrival_ns


def _in_flight(action: Action, sent_ns: int) -> ActionRow:
    """An action not reported yet, as a row: begin and end where it was planned to run."""
    begin = max(action.earliest_ns, sent_ns)
    end = begin + action.expected_duration_ns
    batch = getattr(action, "batch_size", 0)
    return ActionRow(action.action_id, action_kind(action), action.device, action.model, batch, 0, sent_ns,
                     action.earliest_ns, action.latest_ns, action.expected_duration_ns, "in_flight", begin, end,
                     sent_ns, "")  # fmt: skip
