"""Prometheus metrics and per-model statistics of the live server (a ``ControllerObserver``).

Each server has its own registry (several servers may share a process in tests). Names
follow Prometheus conventions: seconds, ``_total`` counters. ``/metrics`` serves
``exposition()``; ``/v2/models/{m}/stats`` serves ``model_stats``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mainspring.protocol import Action, ActionResult, Infer, Request, Response, ResponseStatus, action_kind
from mainspring.protocol.model_names import client_name
from mainspring.telemetry.host_metrics import HostMetrics
from mainspring.telemetry.triton_metrics import TritonMetrics
from mainspring.time import NS_PER_S

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ERROR_BUCKETS_S = (-0.05, -0.01, -0.005, -0.001, -0.0005, 0.0, 0.0005, 0.001, 0.005, 0.01, 0.05)
BUSY_WINDOW_NS = 10 * NS_PER_S


@dataclass
class ModelStats:
    """Triton-style statistics of one model (counts and cumulative nanoseconds)."""

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    rejected_count: int = 0
    execution_count: int = 0  # batches run
    inference_count: int = 0  # requests served by those batches
    last_inference_ns: int = 0


class ServingMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "mainspring_requests", "Requests answered, by model and outcome", ["model", "outcome"], registry=r
        )
        self.good = Counter(
            "mainspring_goodput_requests", "Requests answered successfully within their SLO", ["model"], registry=r
        )
        self.rejections = Counter(
            "mainspring_rejections", "Requests rejected early, by outcome", ["reason"], registry=r
        )
        self.latency = Histogram(
            "mainspring_request_latency_seconds", "Latency of successful requests", ["model"],
            buckets=LATENCY_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.actions = Counter(
            "mainspring_actions", "Worker actions, by kind and status", ["kind", "status"], registry=r
        )
        self.action_seconds = Histogram(
            "mainspring_action_duration_seconds", "Measured duration of actions that ran", ["kind"],
            buckets=LATENCY_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.loads = Counter("mainspring_loads", "Weight loads completed", ["model"], registry=r)
        self.evictions = Counter("mainspring_evictions", "Weight evictions completed", ["model"], registry=r)
        self.prediction_error = Histogram(
            "mainspring_prediction_error_seconds", "Measured minus predicted action duration", ["kind"],
            buckets=ERROR_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.busy = Gauge(
            "mainspring_device_busy_fraction", "Exec lane busy share over the last 10 s", ["device"], registry=r
        )
        self.workers = Gauge("mainspring_workers", "Connected workers", registry=r)
        self.hung_actions = Counter(
            "mainspring_hung_actions", "Actions that never reported: their worker was dropped", registry=r
        )
        self.worker_restarts = Counter(
            "mainspring_worker_restarts", "Local worker processes restarted after they exited", registry=r
        )
        self.workers_dropped = Counter(
            "mainspring_workers_dropped",
            "Workers dropped for misbehaving: an action that never reported (hung), a malformed result "
            "(bad_result) or a message that is not the protocol (bad_message)",
            ["cause"],
            registry=r,
        )
        self.rejoins_deferred = Counter(
            "mainspring_worker_rejoins_deferred",
            "Hellos ignored from a dropped worker whose rejoin backoff has not run out",
            registry=r,
        )
        self.rejoin_backoff = Gauge(
            "mainspring_worker_rejoin_backoff_seconds",
            "The rejoin backoff last imposed on a dropped worker (1 s, doubling with each drop, reset after a "
            "quiet period)",
            registry=r,
        )
        self.frontend_calls = Counter(
            "mainspring_frontend_calls",
            "Inference calls handed over by each frontend process (serve --frontends)",
            ["frontend"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "mainspring_client_disconnects",
            "Clients gone mid-request (hung_up) or cut off (header_timeout, body_timeout, connection_limit), "
            "by frontend process and transport",
            ["frontend", "transport", "cause"],
            registry=r,
        )
        self.loop_lag = Gauge(
            "mainspring_controller_loop_lag_seconds",
            "How late the controller's event loop wakes (held two ticks in a row, decaying by half every 100 ms); "
            "past max_loop_lag_ms new requests get 429",
            registry=r,
        )
        self.controller_cpu = Gauge(
            "mainspring_controller_cpu_seconds",
            "CPU seconds of the controller's event-loop thread by part of the work (receive, admission, policy, "
            "send, results, answer, metrics; unattributed: the loop itself), with cpu_ledger on",
            ["part"],
            registry=r,
        )
        self.model_changes = Counter(
            "mainspring_model_changes",
            "Models loaded, reloaded in place and unloaded (repository API or its polling), by result",
            ["model", "change", "result"],
            registry=r,
        )
        self.devices = Gauge("mainspring_devices", "Connected devices", registry=r)
        self.models = Gauge("mainspring_models", "Models served", registry=r)
        self.model_stats: dict[str, ModelStats] = {}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # ``child``'s
        self.triton = TritonMetrics()  # Triton's names beside ours (``docs/serving.md``)
        self.host = HostMetrics()  # Triton's CPU and GPU gauges
        self._busy: dict[int, deque[tuple[int, int]]] = {}  # device -> recent (begin, end) of infers

    def exposition(self, now_ns: int) -> bytes:
        for device, spans in self._busy.items():
            start = now_ns - BUSY_WINDOW_NS
            while spans and spans[0][1] < start:
                spans.popleft()
            busy = sum(min(end, now_ns) - max(begin, start) for begin, end in spans if end > start)
            self.busy.labels(str(device)).set(max(0.0, min(1.0, busy / BUSY_WINDOW_NS)))
        return generate_latest(self.registry) + (self.triton.exposition(now_ns) + self.host.exposition()).encode()

    def stats(self, model: str) -> ModelStats:
        return self.model_stats.setdefault(model, ModelStats())

    # --- ControllerObserver -------------------------------------------------------------
    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once: ``labels`` takes a lock and builds its key on every call,
        which cost more than the increment on the paths each request and action takes."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def on_request(self, request: Request, now_ns: int) -> None:
        self.triton.on_request(request)

    def on_action(self, action: Action, now_ns: int) -> None:
        self.triton.on_action(action)

    def on_result(self, result: ActionResult, action: Action, now_ns: int) -> None:
        kind = action_kind(action)
        self.child(self.actions, kind, result.status.value).inc()
        if isinstance(action, Infer):
            self.triton.on_result(result, action)
        if not result.ok or result.timing is None:
            return
        timing = result.timing
        self.child(self.action_seconds, kind).observe(timing.duration_ns / NS_PER_S)
        error_s = (timing.duration_ns - action.expected_duration_ns) / NS_PER_S
        self.child(self.prediction_error, kind).observe(error_s)
        if isinstance(action, Infer):
            self._busy.setdefault(action.device, deque()).append((timing.begin_ns, timing.end_ns))
            stats = self.stats(client_name(action.model))
            stats.execution_count += 1
            stats.inference_count += len(action.request_ids)
        elif kind == "load":
            self.loads.labels(client_name(action.model)).inc()
        else:
            self.evictions.labels(client_name(action.model)).inc()

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        self.triton.on_answer(request, response, now_ns)
        latency, model = now_ns - request.arrival_ns, client_name(request.model)  # one series across reloads
        self.child(self.requests, model, response.status.value).inc()
        stats = self.stats(model)
        if response.status is ResponseStatus.SUCCESS:
            self.child(self.latency, model).observe(latency / NS_PER_S)
            if now_ns <= request.deadline_ns:
                self.child(self.good, model).inc()
            stats.success_count += 1
            stats.success_ns += latency
            stats.last_inference_ns = now_ns
        else:
            if response.status is ResponseStatus.REJECTED:
                self.rejections.labels(response.outcome.value).inc()
                stats.rejected_count += 1
            stats.fail_count += 1
            stats.fail_ns += latency
