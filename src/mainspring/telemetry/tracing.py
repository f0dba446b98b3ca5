"""OpenTelemetry traces of requests (the ``otel`` extra; ``otlp_endpoint`` turns them on).

A frontend opens a span per call, from its first byte to its answer, as a child of the client's W3C
``traceparent`` (an HTTP header or gRPC metadata) when it sends one; a malformed one is ignored, as the
W3C recommendation says. A sampled call carries that span's ``traceparent`` to its controller (in
``Submit`` across processes), where ``RequestTraces``, a ``ControllerObserver``, adds two kinds of
children: ``admission`` (the policy's decision and its reason, with the completion it could predict) and
one span per action that ran the request on a worker (its window, its predicted and actual start and
end, its batch and device). Spans go to an OTLP/HTTP collector from a background thread.

Nothing here is imported unless tracing is on: the serving code pays one attribute check per call
when it is off. On, a call not sampled costs a header lookup and a random draw, no span
(``benchmarks/tracing_cost.py``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from mainspring.protocol import Action, ActionResult, Infer, Outcome, Request, Response, ResponseStatus
from mainspring.time import NS_PER_MS, Clock

Answers = list[tuple[Response, Any]]  # a call's, as ``frontend/port.py`` says (not imported: it imports telemetry)
# When a request of a model arriving now could complete at the earliest (None: no device holds it).
Predict = Callable[[str, int], int | None]
_PROPAGATOR = TraceContextTextMapPropagator()
# Outcomes the policy gives at arrival: a request answered with one of them before any action carried it
# was refused by admission; any other answer came after it was admitted (expired in its queue, say).
AT_ARRIVAL = frozenset(
    {Outcome.DEADLINE_AT_ARRIVAL, Outcome.OVERLOADED, Outcome.UNKNOWN_MODEL, Outcome.DOES_NOT_FIT, Outcome.NO_WORKER}
)


def traces_url(endpoint: str) -> str:
    """The collector's OTLP/HTTP traces URL: ``endpoint`` as given, or with ``/v1/traces`` when it names no path."""
    return endpoint if urlsplit(endpoint).path not in ("", "/") else endpoint.rstrip("/") + "/v1/traces"


def _state(headers: Mapping[str, str]) -> dict[str, str]:
    state = headers.get("tracestate")
    return {} if state is None else {"tracestate": state}


def parent_context(headers: Mapping[str, str]) -> Context | None:
    """The span context a W3C ``traceparent`` (and ``tracestate``) names; None when absent or malformed."""
    context = _PROPAGATOR.extract(headers)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def _sampled(context: Context) -> bool:
    return bool(trace.get_current_span(context).get_span_context().trace_flags.sampled)


class Tracing:
    """One process's tracer: sampled spans batched to the collector at ``endpoint`` (``close`` sends what is left).
    ``sample_ratio``: the share of calls without a client's ``traceparent`` that are traced (drawn from
    ``rng``); a client's sampled ``traceparent`` is always followed, an unsampled one never."""

    def __init__(self, endpoint: str, sample_ratio: float, role: str, rng: random.Random | None = None) -> None:
        resource = Resource.create({"service.name": "mainspring", "service.instance.id": role})
        # Calls are sampled before any span is made (an unsampled call costs no span, ``traced_call``): every
        # span started is kept, and the controller's follow the frontend's.
        self._provider = TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_ON))
        self._sample_ratio = sample_ratio
        self._rng = rng or random.Random()
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint))))
        self.tracer = self._provider.get_tracer("mainspring")

    async def traced_call(
        self,
        call: Callable[[str], Awaitable[Answers]],
        model: str,
        samples: int,
        waited_ns: int,
        headers: Mapping[str, str],
    ) -> Answers:
        """``call`` (a ``ControllerPort.infer`` given all but its ``traceparent``: its answers) in a frontend's
        span from the call's first byte (``waited_ns`` ago) to its answers, a child of the ``traceparent`` in
        ``headers`` when there is a valid one; a sampled call hands its span's ``traceparent`` on, for the
        controller's spans of its requests."""
        traceparent = headers.get("traceparent")
        parent = None if traceparent is None else parent_context({"traceparent": traceparent, **_state(headers)})
        if parent is None:  # a trace of its own, at the sampling ratio
            if self._sample_ratio < 1.0 and self._rng.random() >= self._sample_ratio:
                return await call("")
        elif not _sampled(parent):
            return await call("")  # the client's choice
        span = self.tracer.start_span(
            f"infer {model}", parent, SpanKind.SERVER, start_time=time.time_ns() - waited_ns,
            attributes={"mainspring.model": model, "mainspring.samples": samples},
        )  # fmt: skip
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        try:
            answers = await call(carrier.get("traceparent", ""))
        except BaseException as error:  # a refusal of the whole call, or a client gone
            span.set_status(Status(StatusCode.ERROR, str(error)[:300]))
            span.end()
            raise
        outcomes = sorted({response.outcome.value for response, _ in answers})
        span.set_attribute("mainspring.outcomes", outcomes)
        failed = [response for response, _ in answers if response.outcome is not Outcome.SERVED]
        if failed:
            span.set_status(Status(StatusCode.ERROR, failed[0].reason[:300] or failed[0].outcome.value))
        span.end()
        return answers

    def observer(self, clock: Clock, predict: Predict | None) -> RequestTraces:
        return RequestTraces(self, clock, predict)

    def close(self) -> None:
        self._provider.shutdown()  # flushes the batch first

    def flush(self, timeout_ms: int = 10_000) -> bool:
        return self._provider.force_flush(timeout_ms)


@dataclass(slots=True)
class _Traced:
    parent: Context
    arrived_ns: int = -1  # at the controller; -1 until ``on_request``
    deadline_ns: int = 0
    predicted_ns: int | None = None  # the policy's forecast at arrival: the earliest end of a batch of one
    decided: bool = False  # its admission span is out
    actions: list[int] = field(default_factory=list)  # in flight, not reported yet


class RequestTraces:
    """A ``ControllerObserver`` that exports, for each request whose call carried a sampled ``traceparent``
    (``follow``), its admission span and a span per action that ran it. Requests not followed cost a
    dictionary lookup per event."""

    def __init__(self, tracing: Tracing, clock: Clock, predict: Predict | None) -> None:
        self._tracer = tracing.tracer
        # The controller's clock is monotonic live; its offset to the epoch, read once.
        self._epoch_offset_ns = time.time_ns() - clock.now_ns()
        self._predict = predict
        self._traced: dict[int, _Traced] = {}
        self._actions: dict[int, tuple[Infer, int, list[int]]] = {}  # action id -> action, sent at, traced requests

    def follow(self, request_id: int, traceparent: str) -> None:
        """Trace ``request_id`` under ``traceparent`` (a frontend's span); a malformed one is ignored."""
        parent = parent_context({"traceparent": traceparent})
        if parent is not None and _sampled(parent):
            self._traced[request_id] = _Traced(parent)

    def _epoch(self, ns: int) -> int:
        return ns + self._epoch_offset_ns

    # --- ControllerObserver ----------------------------------------------------------------
    def on_request(self, request: Request, now_ns: int) -> None:
        traced = self._traced.get(request.id)
        if traced is None:
            return
        traced.arrived_ns = now_ns
        traced.deadline_ns = request.deadline_ns
        if self._predict is not None:
            traced.predicted_ns = self._predict(request.model, now_ns)

    def on_action(self, action: Action, now_ns: int) -> None:
        if not isinstance(action, Infer) or not self._traced:
            return
        followed = [r for r in action.request_ids if r in self._traced]
        if not followed:
            return
        self._actions[action.action_id] = (action, now_ns, followed)
        for request_id in followed:
            traced = self._traced[request_id]
            traced.actions.append(action.action_id)
            if not traced.decided:
                self._admission(request_id, traced, None, traced.arrived_ns)

    def on_result(self, result: ActionResult, action: Action, now_ns: int) -> None:
        entry = self._actions.pop(action.action_id, None) if self._actions else None
        if entry is None:
            return
        infer, sent_ns, followed = entry
        for request_id in followed:
            traced = self._traced.get(request_id)
            if traced is not None:
                traced.actions.remove(action.action_id)
                self._action_span(traced.parent, infer, sent_ns, result, now_ns)

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        traced = self._traced.pop(request.id, None) if self._traced else None
        if traced is None:
            return
        if not traced.decided:
            self._admission(request.id, traced, response, now_ns)
        for action_id in traced.actions:  # its worker was lost: no result will come
            action, sent_ns, followed = self._actions[action_id]
            followed.remove(request.id)
            if not followed:
                del self._actions[action_id]
            self._action_span(traced.parent, action, sent_ns, None, now_ns)

    # --- the spans ---------------------------------------------------------------------------
    def _admission(self, request_id: int, traced: _Traced, answer: Response | None, now_ns: int) -> None:
        """Admitted (``answer`` None: an action carries it), or answered before any action did: refused at
        arrival when the outcome is one admission gives, else admitted and answered from its queue."""
        traced.decided = True
        refused = answer is not None and answer.outcome in AT_ARRIVAL
        attributes: dict[str, Any] = {"mainspring.request_id": request_id,
                                      "mainspring.decision": "rejected" if refused else "admitted",
                                      "mainspring.deadline_unix_ns": self._epoch(traced.deadline_ns)}  # fmt: skip
        if refused and answer is not None:
            attributes.update({"mainspring.outcome": answer.outcome.value, "mainspring.reason": answer.reason})
        if traced.predicted_ns is not None:
            attributes["mainspring.predicted_completion_unix_ns"] = self._epoch(traced.predicted_ns)
            attributes["mainspring.predicted_after_arrival_ms"] = (traced.predicted_ns - traced.arrived_ns) / NS_PER_MS
        start = self._epoch(traced.arrived_ns)
        span = self._tracer.start_span("admission", traced.parent, start_time=start, attributes=attributes)
        if refused and answer is not None and answer.status is ResponseStatus.REJECTED:
            span.set_status(Status(StatusCode.ERROR, answer.reason[:300] or answer.outcome.value))
        span.end(self._epoch(now_ns) if refused else start)

    def _action_span(
        self, parent: Context, action: Infer, sent_ns: int, result: ActionResult | None, now_ns: int
    ) -> None:
        """The action as it ran on its worker (as planned, and what happened); one that did not run spans
        from its sending to its report."""
        predicted_start = max(action.earliest_ns, sent_ns)
        predicted_end = predicted_start + action.expected_duration_ns
        epoch = self._epoch
        attributes: dict[str, Any] = {
            "mainspring.action_id": action.action_id, "mainspring.device": action.device,
            "mainspring.model": action.model, "mainspring.batch_size": action.batch_size,
            "mainspring.batch_requests": len(action.request_ids),
            "mainspring.window.earliest_unix_ns": epoch(action.earliest_ns),
            "mainspring.window.latest_unix_ns": epoch(action.latest_ns),
            "mainspring.predicted.start_unix_ns": epoch(predicted_start),
            "mainspring.predicted.end_unix_ns": epoch(predicted_end),
            "mainspring.status": result.status.value if result is not None else "lost",
        }  # fmt: skip
        timing = result.timing if result is not None else None
        begin, end = (timing.begin_ns, timing.end_ns) if timing is not None else (sent_ns, now_ns)
        if timing is not None:
            attributes["mainspring.actual.start_unix_ns"] = epoch(begin)
            attributes["mainspring.actual.end_unix_ns"] = epoch(end)
            attributes["mainspring.end_error_ms"] = (end - predicted_end) / NS_PER_MS  # late: positive
        span = self._tracer.start_span(f"infer on device {action.device}", parent, start_time=epoch(begin),
                                       attributes=attributes)  # fmt: skip
        if result is None or not result.ok:
            span.set_status(Status(StatusCode.ERROR, result.message[:300] if result is not None else "worker lost"))
        span.end(epoch(end))
