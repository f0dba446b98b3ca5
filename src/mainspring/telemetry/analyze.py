"""``mainspring analyze``: why requests missed their SLO, from the request and action logs.

Works on the simulator's logs (``simulate --log-dir``) and the live server's (``serve
--log-dir``) alike: both write ``<run>-requests.tsv`` and ``<run>-actions.tsv``. Every request
not answered successfully within its deadline gets one cause:

- rejected at arrival: the deadline could not be met (``deadline_at_arrival``), or the model
  asked for more than its share (``overloaded``);
- expired in queue, while its model was loading, or held nowhere with no load of it started in
  time (its load waited behind other loads, or found no room), or behind other work;
- served late, after waiting for a load (``cold``), or because its batch ran longer than
  predicted, or because the answer's trip back took the rest, or started too late;
- failed: the outcome (worker lost, input failed, ...).

Refused actions (a worker turning down an action whose window had passed) are counted apart,
by reason with the figures taken out. And the run is cut into windows of time, each with how
fast the worker ran (its infers' durations against the run's fastest stretch, for the same
model and batch size), how busy the exec lanes were, and how many requests missed: on a shared
machine, misses that crowd into the windows where the worker ran slow are the machine's noise,
not the plan's; misses where the lanes were busiest are the load's.
"""

from __future__ import annotations

import bisect
import collections
import csv
import logging
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mainspring.telemetry.recorder import ACTION_COLUMNS, REQUEST_COLUMNS
from mainspring.time import ns_to_ms

log = logging.getLogger(__name__)

SUCCESS = "success"


@dataclass
class Cause:
    count: int = 0
    models: collections.Counter[str] = field(default_factory=collections.Counter)
    example: str = ""


@dataclass
class Window:
    """A stretch of the run: its infers' slowdown (their durations over the run's median for the same
    model and batch size, the median of that against the fastest stretch's: 1.0 is the worker at
    its best), the share of the exec lanes' time they took (busy), and its requests' misses."""

    start_s: float
    infers: int
    slowdown: float
    busy: float
    requests: int
    missed: int


SLOW = 1.2  # a window whose median infer ran this much slower than usual


@dataclass
class Analysis:
    run: str
    requests: int
    good: int
    causes: dict[str, Cause]
    refused_actions: collections.Counter[str]
    infer_error_ms: list[float]  # measured minus predicted duration of every infer that ran
    windows: list[Window] = field(default_factory=list)

    @property
    def missed(self) -> int:
        return self.requests - self.good


class LogError(ValueError):
    """A log that is not one ``mainspring`` wrote, or is damaged; the message names the file and line."""


def _rows(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows of a TSV log with ``columns``. A last line cut short (a server stopped mid-write) is
    left out; a short line elsewhere, or a missing column, is a ``LogError``."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = [column for column in columns if column not in (reader.fieldnames or ())]
        if missing:
            raise LogError(f"{path}: not a mainspring log (no column {', '.join(missing)})")
        rows: list[dict[str, str]] = []
        short = 0
        for row in reader:
            if short:
                raise LogError(
                    f"{path}: line {short} does not have the {len(reader.fieldnames or ())} fields of its header"
                )
            if None in row.values() or None in row:
                short = reader.line_num
            rows.append(row)
        if short:
            log.warning("%s: its last line (%d) is cut short, as when a server stops mid-write: left out", path, short)
        return rows[:-1] if short else rows


def runs(directory: Path) -> list[str]:
    """The runs in ``directory``: each with both logs."""
    found = sorted(p.name.removesuffix("-requests.tsv") for p in directory.glob("*-requests.tsv"))
    return [run for run in found if (directory / f"{run}-actions.tsv").is_file()]


def read_run(directory: Path, run: str) -> tuple[list[dict[str, str]], dict[int, dict[str, str]]]:
    """A run's request log, and its action log by action id (rows as the TSV's text)."""
    requests = _rows(directory / f"{run}-requests.tsv", REQUEST_COLUMNS)
    actions = _rows(directory / f"{run}-actions.tsv", ACTION_COLUMNS)
    try:
        return requests, {int(a["action_id"]): a for a in actions}
    except ValueError:
        raise LogError(f"{directory / f'{run}-actions.tsv'}: an action_id that is not a number") from None


def analyze(directory: Path, run: str) -> Analysis:
    requests, actions = read_run(directory, run)
    loads, holdings = loads_and_holdings(actions.values())
    refused: collections.Counter[str] = collections.Counter()
    errors = []
    for action in actions.values():
        if action["status"] != "ok":
            refused[f"{action['kind']}: {_FIGURE.sub('N', action['message'][:80])}"] += 1
        elif action["kind"] == "infer":
            errors.append(ns_to_ms(int(action["end_ns"]) - int(action["begin_ns"]) - int(action["expected_ns"])))
    causes: dict[str, Cause] = collections.defaultdict(Cause)
    good = 0
    for request in requests:
        cause = cause_of(request, actions, loads, holdings)
        if cause is None:
            good += 1
            continue
        entry = causes[cause]
        entry.count += 1
        entry.models[request["model"]] += 1
        entry.example = entry.example or f"request {request['request_id']}: {detail_of(request, actions)[:120]}"
    ordered = dict(sorted(causes.items(), key=lambda item: -item[1].count))
    windows = speed_over_time(requests, actions)
    return Analysis(run, len(requests), good, ordered, refused, errors, windows)


_FIGURE = re.compile(r"\d+(\.\d+)?")


def loads_and_holdings(actions: Iterable[dict[str, str]]) -> tuple[dict[str, list[tuple[int, int]]], Holdings]:
    """Each model's loads that ran (sent, end) and where models were held, from the action log's rows."""
    loads: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    holdings = Holdings()
    for action in actions:
        if action["status"] == "ok":
            holdings.record(action)
            if action["kind"] == "load":
                loads[action["model"]].append((int(action["sent_ns"]), int(action["end_ns"])))
    return loads, holdings


def detail_of(request: dict[str, str], actions: dict[int, dict[str, str]]) -> str:
    """The request's reason; for one served late (which has none), how late, and its batch's time against the plan."""
    if request["reason"] or request["status"] != SUCCESS:
        return request["reason"]
    late = ns_to_ms(int(request["answered_ns"]) - int(request["deadline_ns"]))
    action = actions.get(int(request["action_id"]))
    if action is None:
        return f"answered {late:.1f} ms after its deadline"
    ran, expected = ns_to_ms(int(action["end_ns"]) - int(action["begin_ns"])), ns_to_ms(int(action["expected_ns"]))
    return (f"answered {late:.1f} ms after its deadline; its batch of {action['requests']} ran {ran:.1f} ms "
            f"against {expected:.1f} predicted")  # fmt: skip


def speed_over_time(
    requests: list[dict[str, str]], actions: dict[int, dict[str, str]], count: int = 10
) -> list[Window]:
    """The run cut into ``count`` windows by arrival time (requests) and begin time (infers)."""
    infers = [a for a in actions.values() if a["kind"] == "infer" and a["status"] == "ok"]
    if not requests or not infers:
        return []
    by_shape: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for action in infers:
        by_shape[action["model"], action["batch_size"]].append(int(action["end_ns"]) - int(action["begin_ns"]))
    usual = {shape: max(1.0, statistics.median(durations)) for shape, durations in by_shape.items()}
    start = min(int(r["arrival_ns"]) for r in requests)
    end = max(int(r["arrival_ns"]) for r in requests) + 1
    width = max(1, -(-(end - start) // count))
    ratios: list[list[float]] = [[] for _ in range(count)]
    busy = [0] * count
    for action in infers:
        slot = (int(action["begin_ns"]) - start) // width
        if 0 <= slot < count:
            duration = int(action["end_ns"]) - int(action["begin_ns"])
            ratios[slot].append(duration / usual[action["model"], action["batch_size"]])
            busy[slot] += duration
    arrived, missed = [0] * count, [0] * count
    for request in requests:
        slot = (int(request["arrival_ns"]) - start) // width
        arrived[slot] += 1
        missed[slot] += not met_slo(request)
    medians = [statistics.median(r) if r else 0.0 for r in ratios]
    fastest = min((m for m in medians if m), default=1.0)  # the worker at its best stretch is 1.0
    lanes = width * len({a["device"] for a in infers})
    return [
        Window(i * width / 1e9, len(ratios[i]), medians[i] / fastest, busy[i] / lanes, arrived[i], missed[i])
        for i in range(count)
    ]


def met_slo(request: dict[str, str]) -> bool:
    """Answered successfully by its deadline."""
    return request["status"] == SUCCESS and int(request["answered_ns"]) <= int(request["deadline_ns"])


class Holdings:
    """Where each model was held over the run, from its loads (held from their end) and evictions
    (gone from when they were sent: the controller counts the room free from then)."""

    def __init__(self) -> None:
        self._events: dict[str, dict[str, list[tuple[int, bool]]]] = {}  # model -> device -> (time, held)
        self._sorted = True

    def record(self, action: dict[str, str]) -> None:
        if action["kind"] in ("load", "evict"):
            held = action["kind"] == "load"
            at = int(action["end_ns"] if held else action["sent_ns"])
            self._events.setdefault(action["model"], {}).setdefault(action["device"], []).append((at, held))
            self._sorted = False

    def held_anywhere(self, model: str, at_ns: int) -> bool | None:
        """Whether ``model`` was held on some device at ``at_ns``; None when the logs never load
        or evict it (held since before the log began, or never: they cannot say)."""
        if not self._sorted:  # loads are placed at their end, evictions when sent: not in log order
            for by_device in self._events.values():
                for events in by_device.values():
                    events.sort()
            self._sorted = True
        devices = self._events.get(model)
        if not devices:
            return None
        for events in devices.values():
            since = bisect.bisect_right(events, (at_ns, True))  # events at or before ``at_ns``
            held = events[since - 1][1] if since else not events[0][1]  # none yet: held before the log if first evicted
            if held:
                return True
        return False


def cause_of(
    request: dict[str, str],
    actions: dict[int, dict[str, str]],
    loads: dict[str, list[tuple[int, int]]],
    holdings: Holdings | None = None,
) -> str | None:
    """Why ``request`` missed its SLO; None if it did not."""
    if met_slo(request):
        return None
    deadline, answered = (int(request[k]) for k in ("deadline_ns", "answered_ns"))
    outcome = request.get("outcome") or request["status"]
    if request["status"] == SUCCESS:
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
        # Expiry comes at the last moment a batch could still start: a load that ended before it had
        # made the model ready in time, and what held the request was other work.
        loading = any(sent <= answered and end >= answered for sent, end in loads.get(request["model"], ()))
        if loading:
            return "expired in queue: while its model was loading"
        if holdings is not None and holdings.held_anywhere(request["model"], answered) is False:
            return "expired in queue: its model held nowhere, no load of it started in time"
        return "expired in queue: behind other work"

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
    if analysis.windows and analysis.missed:
        lines.append(
            "  over time (s from the first arrival; infers' slowdown against the fastest stretch; exec lanes busy):"
        )
        lines.extend(f"  {w.start_s:>8.1f}  slowdown {w.slowdown:4.2f}, busy {w.busy:4.0%} over {w.infers:>5} infers; "
                     f"{w.missed:>5} of {w.requests:>6} requests missed" for w in analysis.windows)  # fmt: skip
        slow = [w for w in analysis.windows if w.slowdown >= SLOW]
        lines.append(f"  {sum(w.missed for w in slow)} of {analysis.missed} misses fell in the {len(slow)} of "
                     f"{len(analysis.windows)} stretches where infers took {SLOW:.0%} of their best time "
                     "or more")  # fmt: skip
    return "\n".join(lines)
