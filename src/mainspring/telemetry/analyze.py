"""``mainspring analyze``: why requests missed their SLO, from the request and action logs.

Works on the simulator's logs (``simulate --log-dir``) and the live server's (``serve
--log-dir``) alike: both write ``<run>-requests.tsv`` and ``<run>-actions.tsv``. Every request
not answered successfully within its deadline gets one cause:

- rejected at arrival: the deadline could not be met (``deadline_at_arrival``), or the model
  asked for more than its share (``overloaded``);
- expired in queue, while its model was loading, or behind other work;
- served late, after waiting for a load (``cold``), or because its batch ran longer than
  predicted, or because the answer's trip back took the rest, or started too late;
- failed: the outcome (worker lost, input failed, ...).

Refused actions (a worker turning down an action whose window had passed) are counted apart.
"""

from __future__ import annotations

import collections
import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mainspring.time import ns_to_ms

SUCCESS = "success"


@dataclass
class Cause:
    count: int = 0
    models: collections.Counter[str] = field(default_factory=collections.Counter)
    example: str = ""


@dataclass
class Analysis:
    run: str
    requests: int
    good: int
    causes: dict[str, Cause]
    refused_actions: collections.Counter[str]
    infer_error_ms: list[float]  # measured minus predicted duration of every infer that ran

    @property
    def missed(self) -> int:
        return self.requests - self.good


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def runs(directory: Path) -> list[str]:
    """The runs in ``directory``: each with both logs."""
    found = sorted(p.name.removesuffix("-requests.tsv") for p in directory.glob("*-requests.tsv"))
    return [run for run in found if (directory / f"{run}-actions.tsv").is_file()]


def analyze(directory: Path, run: str) -> Analysis:
    requests = _rows(directory / f"{run}-requests.tsv")
    actions = {int(a["action_id"]): a for a in _rows(directory / f"{run}-actions.tsv")}
    loads: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    refused: collections.Counter[str] = collections.Counter()
    errors = []
    for action in actions.values():
        if action["status"] != "ok":
            refused[f"{action['kind']}: {action['message'][:80]}"] += 1
        elif action["kind"] == "load":
            loads[action["model"]].append((int(action["sent_ns"]), int(action["end_ns"])))
        elif action["kind"] == "infer":
            errors.append(ns_to_ms(int(action["end_ns"]) - int(action["begin_ns"]) - int(action["expected_ns"])))
    causes: dict[str, Cause] = collections.defaultdict(Cause)
    good = 0
    for request in requests:
        cause = cause_of(request, actions, loads)
        if cause is None:
            good += 1
            continue
        entry = causes[cause]
        entry.count += 1
        entry.models[request["model"]] += 1
        entry.example = entry.example or f"request {request['request_id']}: {request['reason'][:120]}"
    ordered = dict(sorted(causes.items(), key=lambda item: -item[1].count))
    return Analysis(run, len(requests), good, ordered, refused, errors)


def cause_of(
    request: dict[str, str], actions: dict[int, dict[str, str]], loads: dict[str, list[tuple[int, int]]]
) -> str | None:
    """Why ``request`` missed its SLO; None if it did not."""
    arrival, deadline, answered = (int(request[k]) for k in ("arrival_ns", "deadline_ns", "answered_ns"))
    outcome = request.get("outcome") or request["status"]
    if request["status"] == SUCCESS:
        if answered <= deadline:
            return None
        if request["cold"] == "1":
            return "served late: waited for its model to load"
        action = actions.get(int(request["action_id"]))
        if action is None:
            return "served late"
        begin, end, expected = int(action["begin_ns"]), int(action["end_ns"]), int(action["expected_ns"])
        if end - begin > expected and end > deadline:
            return "served late: the batch ran longer than predicted"
        if end <= deadline:
            return "served late: the answer's way back took the rest"
        return "served late: started too late to finish in time"
    if outcome == "deadline_at_arrival":
        return "rejected at arrival: the deadline could not be met"
    if outcome == "overloaded":
        return "rejected at arrival: over its share of the devices (overloaded)"
    if outcome in ("expired_in_queue", "queue_timeout", "timed_out"):
        loading = any(sent <= answered and end >= arrival for sent, end in loads.get(request["model"], ()))
        return "expired in queue: " + ("while its model was loading" if loading else "behind other work")
    return f"failed: {outcome}"


def format_analysis(analysis: Analysis, top: int = 3) -> str:
    share = analysis.missed / analysis.requests if analysis.requests else 0.0
    lines = [f"{analysis.run}: {analysis.requests} requests, {analysis.missed} missed the SLO ({share:.4%})"]
    for cause, entry in analysis.causes.items():
        models = ", ".join(f"{m} {n}" for m, n in entry.models.most_common(top))
        lines.append(f"  {entry.count:>8}  {cause}  [{models}]")
        lines.append(f"            e.g. {entry.example}")
    if analysis.infer_error_ms:
        errors = np.asarray(analysis.infer_error_ms)
        early = float(np.mean(errors < -5.0))
        p1, p50, p99 = np.percentile(errors, [1, 50, 99])
        lines.append(f"  infer duration minus prediction (ms): p1 {p1:+.2f}, p50 {p50:+.2f}, p99 {p99:+.2f}, "
                     f"max {errors.max():+.2f}; {early:.1%} finished more than 5 ms early")  # fmt: skip
    if analysis.refused_actions:
        lines.append(f"  refused actions: {sum(analysis.refused_actions.values())}")
        lines.extend(f"  {n:>8}  {reason}" for reason, n in analysis.refused_actions.most_common(top))
    return "\n".join(lines)
