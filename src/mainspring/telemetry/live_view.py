"""The live page's per-model and per-device panels (``GET /dashboard``), beside the lanes (``timeline``).

``ModelWindow`` is a ``ControllerObserver`` that keeps one small tuple per answer (at most
``max_answers``, so memory stays bounded under any load) and each model's last success; the
summaries (rate, attainment against each request's deadline, p50 and p99 latency of the answers
served, rejections by outcome) are computed only when the page asks. ``device_pools`` reads which
models each device holds (``Timeline.held``) against its weight pool.
"""

from __future__ import annotations

import collections
from collections import deque
from collections.abc import Mapping
from typing import Any

from mainspring.models.profile import ModelProfile
from mainspring.protocol import Action, ActionResult, DeviceSpec, Request, Response, ResponseStatus
from mainspring.time import NS_PER_MS, NS_PER_S

# A model with no answers in the window.
NO_TRAFFIC: dict[str, Any] = {"rate_rps": 0.0, "answered": 0, "attained": None, "p50_ms": None, "p99_ms": None}


class ModelWindow:
    def __init__(self, max_answers: int = 100_000) -> None:
        # (answered at, model key, latency, met its deadline, outcome: "" when served)
        self._answers: deque[tuple[int, str, int, bool, str]] = deque(maxlen=max_answers)
        self.last_used: dict[str, int] = {}  # model key -> when its last success was answered

    def on_request(self, request: Request, now_ns: int) -> None:
        pass

    def on_action(self, action: Action, now_ns: int) -> None:
        pass

    def on_result(self, result: ActionResult, action: Action, now_ns: int) -> None:
        pass

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        served = response.status is ResponseStatus.SUCCESS
        met = served and now_ns <= request.deadline_ns
        outcome = "" if served else response.outcome.value
        self._answers.append((now_ns, request.model, now_ns - request.arrival_ns, met, outcome))
        if served:
            self.last_used[request.model] = now_ns

    def summary(self, now_ns: int, seconds: float) -> dict[str, dict[str, Any]]:
        """Per model key answered in the last ``seconds``: rate (answers a second), attained (the share answered
        successfully by the deadline), p50 and p99 latency of those served (ms), and refusals by outcome
        (``late``: served after the deadline)."""
        since = now_ns - round(seconds * NS_PER_S)
        latencies: dict[str, list[int]] = collections.defaultdict(list)
        answered: collections.Counter[str] = collections.Counter()
        met: collections.Counter[str] = collections.Counter()
        refused: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for at, model, latency, good, outcome in reversed(self._answers):
            if at < since:
                break
            answered[model] += 1
            if good:
                met[model] += 1
            if outcome:
                refused[model][outcome] += 1
            else:
                latencies[model].append(latency)
                if not good:
                    refused[model]["late"] += 1
        return {
            model: {
                "rate_rps": round(n / seconds, 2),
                "answered": n,
                "attained": round(met[model] / n, 5),
                "p50_ms": _percentile(latencies[model], 0.50),
                "p99_ms": _percentile(latencies[model], 0.99),
                "rejections": dict(refused[model]),
            }
            for model, n in answered.items()
        }


def _percentile(values: list[int], share: float) -> float | None:
    """The nearest-rank percentile of ``values`` (ns) in ms; None when there are none."""
    if not values:
        return None
    values.sort()
    return round(values[min(len(values) - 1, int(share * len(values)))] / NS_PER_MS, 3)


Held = Mapping[int, Mapping[str, int]]  # device -> model key -> held since (``Timeline.held``)
Served = Mapping[str, tuple[str, ModelProfile, float]]  # model key -> its name, profile and SLO (ms)


def model_rows(window: ModelWindow, held: Held, served: Served, now_ns: int, seconds: float) -> list[dict[str, Any]]:
    """One row per served model (``served``: key -> name, profile, SLO in ms), traffic or not, by name."""
    summary = window.summary(now_ns, seconds)
    rows = []
    for key, (name, _, slo_ms) in served.items():
        traffic = summary.get(key) or {**NO_TRAFFIC, "rejections": {}}
        used = window.last_used.get(key)
        rows.append(
            {
                "model": name,
                "slo_ms": slo_ms,
                **traffic,
                "resident": sorted(device for device, models in held.items() if key in models),
                "last_used_s": None if used is None else round((now_ns - used) / NS_PER_S, 3),
            }
        )
    return sorted(rows, key=lambda row: row["model"])


def device_pools(specs: Mapping[int, DeviceSpec], held: Held, served: Served) -> list[dict[str, Any]]:
    """Each connected device's weight pool: its pages, those the models it holds take, and those models by name."""
    pools = []
    for device, spec in sorted(specs.items()):
        keys = sorted(held.get(device, {}))
        used = sum(served[key][1].pages(spec.page_bytes) for key in keys if key in served)
        names = [served[key][0] if key in served else key for key in keys]
        pools.append(
            {"device": device, "kind": spec.kind, "total_pages": spec.total_pages, "used_pages": used, "models": names}
        )
    return pools
