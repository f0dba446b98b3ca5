"""Triton's per-model metrics beside ours, under the names, types, labels and units of Triton's metrics guide
(``docs/user_guide/metrics.md`` in ``triton-inference-server/server``), so that a Triton user's dashboards and
alerts read Mainspring unchanged. ``docs/serving.md``, "Triton's metrics", maps each to what is measured here.

Counters with Triton's names carry no ``_total`` (prometheus_client would add one), so these families are
written as text beside the registry's. Per request the cost is a dict lookup for the model's series and a few
integer additions; the summaries' quantiles are computed when ``/metrics`` is read.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from mainspring.protocol import Action, ActionResult, Infer, Outcome, Request, Response
from mainspring.protocol.model_names import client_name
from mainspring.time import NS_PER_S, NS_PER_US

REJECTED, CANCELED, BACKEND, OTHER = "REJECTED", "CANCELED", "BACKEND", "OTHER"
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)  # Triton's ``reason`` label on failures
# Why a request failed, as Triton's reasons: refused by the scheduler (Triton's queue timeouts and full
# queues), failed in the model or on its worker, or anything else. A client gone does not cancel a request.
REASON_OF_OUTCOME = {
    Outcome.DEADLINE_AT_ARRIVAL: REJECTED,
    Outcome.OVERLOADED: REJECTED,
    Outcome.EXPIRED_IN_QUEUE: REJECTED,
    Outcome.QUEUE_TIMEOUT: REJECTED,
    Outcome.INPUT_FAILED: BACKEND,
    Outcome.INFERENCE_FAILED: BACKEND,
    Outcome.LOAD_FAILED: BACKEND,
    Outcome.BAD_RESULT: BACKEND,
    Outcome.WORKER_LOST: BACKEND,
}
QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)  # Triton's default summary quantiles
SUMMARY_WINDOW_NS = 60 * NS_PER_S  # prometheus-cpp's default max age, Triton's
# Per model: the window is the last 60 s or these, whichever is fewer; sorting them when /metrics is read holds the
# controller's loop about a millisecond (a slow shared core's figure)
SUMMARY_MAX_OBSERVATIONS = 4096

COUNTERS = (  # (name, attribute of ModelSeries in ns or a count, help)
    ("nv_inference_request_success", "success",
     "Requests answered successfully (each sample of a call is one request)"),
    ("nv_inference_count", "inferences", "Inferences performed: the requests in the batches executed"),
    ("nv_inference_exec_count", "executions", "Batches executed (infer actions that ran)"),
    ("nv_inference_request_duration_us", "request_ns",
     "Cumulative time from arrival (headers read) to answer of successful requests, in microseconds"),
    ("nv_inference_queue_duration_us", "queue_ns",
     "Cumulative time from arrival to the start of the batch on the worker of successful requests, in microseconds"),
    ("nv_inference_compute_input_duration_us", "input_ns",
     "Not measured apart: copying the inputs is part of the batch's execution (compute_infer), in microseconds"),
    ("nv_inference_compute_infer_duration_us", "infer_ns",
     "Cumulative execution time of the batches that served successful requests, each request counting its "
     "batch's, in microseconds"),
    ("nv_inference_compute_output_duration_us", "output_ns",
     "Not measured apart: copying the outputs is part of the batch's execution (compute_infer), in microseconds"),
)  # fmt: skip
SUMMARIES = (  # (name, index in ModelSeries.recent, help)
    ("nv_inference_request_summary_us", 0, "Time from arrival to answer of successful requests, in microseconds"),
    ("nv_inference_queue_summary_us", 1,
     "Time from arrival to the start of the batch on the worker of successful requests, in microseconds"),
    ("nv_inference_compute_infer_summary_us", 2,
     "Execution time of the batch that served each successful request, in microseconds"),
)  # fmt: skip


class ModelSeries:
    """Everything counted for one model at one version (its label set)."""

    __slots__ = ("answered_at", "executions", "failures", "infer_ns", "inferences", "input_ns", "labels", "output_ns",
                 "pending", "queue_ns", "recent", "request_ns", "success")  # fmt: skip

    def __init__(self, model: str, version: int) -> None:
        self.labels = (model, str(version))
        self.success = self.inferences = self.executions = self.pending = 0
        self.request_ns = self.queue_ns = self.infer_ns = 0
        self.input_ns = self.output_ns = 0  # not measured apart (COUNTERS)
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        # The latest successful requests: when each was answered, and its request, queue and compute infer ns
        self.answered_at: deque[int] = deque(maxlen=SUMMARY_MAX_OBSERVATIONS)
        self.recent = tuple(deque[int](maxlen=SUMMARY_MAX_OBSERVATIONS) for _ in SUMMARIES)


class TritonMetrics:
    """A ``ControllerObserver`` (called by ``ServingMetrics``) and the lifecycle's record of load times."""

    def __init__(self) -> None:
        self._by_key: dict[str, ModelSeries] = {}  # by the policy's name for a model (``name@n`` once reloaded)
        self._by_labels: dict[tuple[str, str], ModelSeries] = {}  # keys that share a version share a series
        self._versions: dict[str, int] = {}  # by key, as the lifecycle serves it
        self._load_s: dict[str, tuple[tuple[str, str], float]] = {}  # by key: its labels and load time
        self._open: dict[int, ModelSeries] = {}  # requests not answered yet
        self._pending: set[int] = set()  # those of them waiting to be sent to a worker
        self._ran: dict[int, tuple[int, int]] = {}  # request -> (begin, duration) of the batch that ran it

    # --- the lifecycle ---------------------------------------------------------------------------
    def serve(self, key: str, version: int, load_s: float | None = None) -> None:
        """``key`` is served at ``version`` (before any of its requests), loaded in ``load_s`` when measured."""
        self._versions[key] = version
        self.series(key)  # every served model has its series, as in Triton, from its load on
        if load_s is not None:
            self._load_s[key] = ((client_name(key), str(version)), load_s)

    def retire(self, key: str) -> None:
        """``key`` is no longer served: its load time goes, as Triton's does on unload; its counters stay."""
        self._load_s.pop(key, None)

    # --- per request ------------------------------------------------------------------------------
    def series(self, key: str) -> ModelSeries:
        series = self._by_key.get(key)
        if series is None:
            labels = (client_name(key), str(self._versions.get(key, 1)))
            series = self._by_labels.get(labels) or ModelSeries(labels[0], int(labels[1]))
            self._by_key[key] = self._by_labels[labels] = series
        return series

    def refused(self, key: str, count: int) -> None:
        """``count`` requests for ``key`` refused before they were admitted (the server's load limits)."""
        self.series(key).failures[REJECTED] += count

    def on_request(self, request: Request) -> None:
        series = self._by_key.get(request.model) or self.series(request.model)
        series.pending += 1
        self._open[request.id] = series
        self._pending.add(request.id)

    def on_action(self, action: Action) -> None:
        if isinstance(action, Infer):  # handed to its worker: no longer pending, as Triton's "about to execute"
            pending, open_requests = self._pending, self._open
            for request_id in action.request_ids:
                if request_id in pending:
                    pending.discard(request_id)
                    open_requests[request_id].pending -= 1

    def on_result(self, result: ActionResult, action: Infer) -> None:
        timing, open_requests = result.timing, self._open
        if not result.ok or timing is None:  # its requests wait again, unless they are answered now
            for request_id in action.request_ids:
                series = open_requests.get(request_id)
                if series is not None and request_id not in self._pending:
                    series.pending += 1
                    self._pending.add(request_id)
            return
        series = self.series(action.model)
        series.executions += 1
        series.inferences += len(action.request_ids)
        ran = (timing.begin_ns, timing.duration_ns)
        for request_id in action.request_ids:
            if request_id in open_requests:  # not answered already (a shutdown answers all)
                self._ran[request_id] = ran

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        request_id = request.id
        series = self._open.pop(request_id, None) or self.series(request.model)
        if request_id in self._pending:
            self._pending.discard(request_id)
            series.pending -= 1
        ran = self._ran.pop(request_id, None)
        if response.outcome is not Outcome.SERVED:  # the one success (``Outcome.status``), without its lookup
            series.failures[REASON_OF_OUTCOME.get(response.outcome, OTHER)] += 1
            return
        latency = now_ns - request.arrival_ns
        queue, infer = (0, 0) if ran is None else (max(0, ran[0] - request.arrival_ns), ran[1])
        series.success += 1
        series.request_ns += latency
        series.queue_ns += queue
        series.infer_ns += infer
        series.answered_at.append(now_ns)
        request_window, queue_window, infer_window = series.recent
        request_window.append(latency)
        queue_window.append(queue)
        infer_window.append(infer)

    # --- /metrics ---------------------------------------------------------------------------------
    def exposition(self, now_ns: int) -> str:
        """These families in Prometheus's text format (labels in Triton's order, alphabetical)."""
        every = list(self._by_labels.values())
        lines: list[str] = []
        for name, attribute, text in COUNTERS:
            _header(lines, name, "counter", text)
            divisor = NS_PER_US if name.endswith("_us") else 1
            lines += [f"{name}{{{_labels(s.labels)}}} {getattr(s, attribute) // divisor}" for s in every]
        failure = "Requests answered with an error, by Triton's reason (each sample of a call is one request)"
        _header(lines, "nv_inference_request_failure", "counter", failure)
        for s in every:
            model, version = s.labels
            lines += [f'nv_inference_request_failure{{model="{_escape(model)}",reason="{reason}",'
                      f'version="{version}"}} {count}' for reason, count in s.failures.items()]  # fmt: skip
        _header(lines, "nv_inference_pending_request_count", "gauge",
                "Requests admitted and not yet handed to a worker in a batch")  # fmt: skip
        lines += [f"nv_inference_pending_request_count{{{_labels(s.labels)}}} {s.pending}" for s in every]
        for s in every:
            _prune(s, now_ns - SUMMARY_WINDOW_NS)
        for name, index, text in SUMMARIES:
            _header(lines, name, "summary", text)
            for s in every:
                lines += _summary(name, s, index)
        load = "How long the last load of each served model took on every worker (repository API or polling)"
        _header(lines, "nv_model_load_duration_secs", "gauge", load)
        loads = dict(self._load_s.values())  # a reload of the same version: the newer load
        lines += [f"nv_model_load_duration_secs{{{_labels(labels)}}} {seconds!r}" for labels, seconds in loads.items()]
        return "\n".join(lines) + "\n"


def _summary(name: str, series: ModelSeries, index: int) -> Iterable[str]:
    labels = _labels(series.labels)
    total = (series.request_ns, series.queue_ns, series.infer_ns)[index]
    yield f"{name}_count{{{labels}}} {series.success}"
    yield f"{name}_sum{{{labels}}} {total // NS_PER_US}"
    values = sorted(series.recent[index])
    for q in QUANTILES:  # the nearest rank; NaN with none in the window, as prometheus-cpp's
        value = values[max(0, math.ceil(q * len(values)) - 1)] / NS_PER_US if values else math.nan
        yield f'{name}{{{labels},quantile="{q}"}} {"NaN" if math.isnan(value) else repr(value)}'


def _prune(series: ModelSeries, since_ns: int) -> None:
    answered_at = series.answered_at
    while answered_at and answered_at[0] < since_ns:
        answered_at.popleft()
        for window in series.recent:
            window.popleft()


def _header(lines: list[str], name: str, kind: str, text: str) -> None:
    lines.append(f"# HELP {name} {text}")
    lines.append(f"# TYPE {name} {kind}")


def _labels(labels: tuple[str, str]) -> str:
    return f'model="{_escape(labels[0])}",version="{labels[1]}"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
