"""The live page's data (``GET /dashboard/timeline``), made in the controller from what it already observes.

``ModelWindow`` is a ``ControllerObserver`` that keeps one small tuple per answer while a page polls (from its
first poll until ``horizon_s`` after its last: with no page open an answer costs it one comparison), at most
``max_answers``, so memory stays bounded under any load. The page asks for what came since its last poll (its
cursor) and works out each model's rate, attainment, p50 and p99 and rejections by reason itself, from the
answers: a poll costs the controller a search and the encoding of half a second's rows, not a pass over the
window (``benchmarks/dashboard_cost.py``).
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple

from mainspring.models.profile import ModelProfile
from mainspring.protocol import Action, ActionResult, DeviceSpec, Request, Response
from mainspring.telemetry.recorder import ACTION_COLUMNS
from mainspring.telemetry.timeline import SERVED, Timeline
from mainspring.time import NS_PER_S

Held = Mapping[int, Mapping[str, int]]  # device -> model key -> held since (``Timeline.held``)
Served = Mapping[str, tuple[str, ModelProfile, float]]  # model key -> its name, profile and SLO (ms)


class AnswerRow(NamedTuple):
    answered_ns: int
    model: str  # its key
    latency_ns: int
    met: bool  # answered successfully by its deadline
    outcome: str  # why it was refused; "" when it was served (late or not)


ANSWER_COLUMNS = AnswerRow._fields


class ModelWindow:
    def __init__(self, horizon_s: float = 30.0, max_answers: int = 100_000) -> None:
        self._answers: deque[tuple[int, str, int, bool, str]] = deque(maxlen=max_answers)  # ``AnswerRow``s
        self._horizon_ns = round(horizon_s * NS_PER_S)
        self._watched_until_ns = -1  # answers are kept until then: a page polled within the horizon
        self._watched_since_ns = -1  # and since then without a break

    def watched(self, now_ns: int) -> None:
        """A page polled: keep the answers for the horizon to come."""
        if now_ns > self._watched_until_ns:  # the first poll, or the first after a break: none kept before
            self._watched_since_ns = now_ns
        self._watched_until_ns = now_ns + self._horizon_ns

    def complete_since(self) -> int:
        """From when every answer is kept (the page's figures count from then): the poll that began the watch,
        or the oldest answer kept once ``max_answers`` pushed older ones out."""
        full = len(self._answers) == self._answers.maxlen
        return max(self._watched_since_ns, self._answers[0][0]) if full else self._watched_since_ns

    def on_request(self, request: Request, now_ns: int) -> None:
        pass

    def on_action(self, action: Action, now_ns: int) -> None:
        pass

    def on_result(self, result: ActionResult, action: Action, now_ns: int) -> None:
        pass

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        if now_ns > self._watched_until_ns:  # no page open: nothing kept (every request passes here)
            return
        served = response.outcome is SERVED  # plain tuples (an ``AnswerRow``'s fields): cheaper to make
        met = served and now_ns <= request.deadline_ns
        outcome = "" if served else response.outcome.value
        self._answers.append((now_ns, request.model, now_ns - request.arrival_ns, met, outcome))

    def since(self, since_ns: int) -> list[tuple[int, str, int, bool, str]]:
        """The answers made after ``since_ns``, oldest first (``AnswerRow``'s fields)."""
        first = bisect.bisect_right(self._answers, since_ns, key=lambda row: row[0])
        return list(itertools.islice(reversed(self._answers), len(self._answers) - first))[::-1]


def page_view(
    timeline: Timeline, window: ModelWindow, now_ns: int, since_ns: int, served: Served,
    specs: Mapping[int, DeviceSpec], loop_lag_ns: int, last_used: Mapping[str, int],
) -> dict[str, Any]:  # fmt: skip
    """One controller's part of the page: rows since ``since_ns`` (actions and answers, with their columns), the
    actions in flight, the last misses explained, the served models, when each last served a request
    (``last_used``, by key), each device's pool and the loop lag. ``since_ns`` is in it, for the page to tell
    rows that follow its last view's (``now_ns``) from a window anew; and ``answers_from_ns``, from when the
    answers are complete."""
    window.watched(now_ns)
    view = timeline.view(now_ns, since_ns, specs)
    view |= {
        "now_ns": now_ns,
        "since_ns": since_ns,
        "answers_from_ns": window.complete_since(),
        "action_columns": ACTION_COLUMNS,
        "answer_columns": ANSWER_COLUMNS,
        "answers": window.since(since_ns),
        "last_used_ns": last_used,
        "models": [{"key": key, "model": name, "slo_ms": slo_ms} for key, (name, _, slo_ms) in served.items()],
        "pools": device_pools(specs, timeline.held, served),
        "loop_lag_ms": round(loop_lag_ns / 1e6, 3),
    }
    return view


def device_pools(specs: Mapping[int, DeviceSpec], held: Held, served: Served) -> list[dict[str, Any]]:
    """Each connected device's weight pool: its pages, those the models it holds take, and those models' keys."""
    pools = []
    for device, spec in sorted(specs.items()):
        keys = sorted(held.get(device, {}))
        used = sum(served[key][1].pages(spec.page_bytes) for key in keys if key in served)
        pools.append({"device": device, "kind": spec.kind, "total_pages": spec.total_pages, "used_pages": used,
                      "models": keys})  # fmt: skip
    return pools


def horizon_since(now_ns: int, seconds: float, cursor: str) -> int:
    """From when a poll's rows are wanted: the last ``seconds``, or after the cursor a view gave (``str(now_ns)``)
    when that is later; a cursor that is not one, or is ahead of this clock (another process's: a controller
    started again), is ignored (the whole window again)."""
    since = now_ns - round(seconds * NS_PER_S)
    if not (cursor.isascii() and cursor.isdigit()) or int(cursor) > now_ns:
        return since
    return max(since, int(cursor))
