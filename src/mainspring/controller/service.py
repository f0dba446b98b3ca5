"""The live controller: a ``Controller`` on an asyncio loop, fed by workers and the frontend.

It is the only place that reads the wall clock or does I/O for the policy. Workers join
and leave (their devices are added to or removed from the policy), models are loaded and
unloaded through the repository API, and every client request is a future answered
exactly once: a result, an early rejection with the reason, or an error.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import random
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mainspring.controller.controller import Controller, ControllerObserver, Observers
from mainspring.controller.lifecycle import ModelLifecycle
from mainspring.controller.overload import ServerLoadLimits
from mainspring.controller.worker_events import WorkerEventHandler
from mainspring.controller.workers import WorkerSet
from mainspring.frontend.port import Answer, ServedModel, ServiceError
from mainspring.frontend.shedding import SHED
from mainspring.protocol import Outcome, Request, Response
from mainspring.protocol.requests import DEFAULT_DEADLINE_MARGIN_MS
from mainspring.protocol.tensors import Sample, TensorSpec
from mainspring.scheduler.base import Forecasts, Membership, Warms
from mainspring.scheduler.registry import DEFAULT_POLICY, make_scheduler
from mainspring.telemetry.live_view import ModelWindow, horizon_since, page_view
from mainspring.telemetry.metrics import ModelStats, ServingMetrics
from mainspring.telemetry.recorder import LogWriter
from mainspring.telemetry.timeline import Timeline
from mainspring.time import NO_LEDGER, NS_PER_S, Clock, CpuLedger, LoopTimer, Timer
from mainspring.transport.links import WorkerHandle

if TYPE_CHECKING:  # imported only where tracing is on (the ``otel`` extra)
    from mainspring.telemetry.tracing import RequestTraces, Tracing

log = logging.getLogger(__name__)


class ControllerService:
    def __init__(
        self,
        policy: str = DEFAULT_POLICY,
        default_slo_ms: float = 100.0,
        seed: int = 0,
        deadline_margin_ms: float = DEFAULT_DEADLINE_MARGIN_MS,
        watchdog_grace_s: float = 10.0,
        max_outstanding: int = 100_000,
        max_outstanding_bytes: int = 2 * 1024**3,
        log_dir: Path | None = None,
        max_loop_lag_ms: float | None = None,
        policy_settings: Mapping[str, object] | None = None,
        timer: Timer | None = None,
        ledger: CpuLedger = NO_LEDGER,
        tracing: Tracing | None = None,
    ) -> None:
        self.timer = timer or LoopTimer()  # the wake-ups the policy asks for, on the clock it is told
        self.clock: Clock = self.timer
        self.ledger = ledger  # this process's CPU by part (``cpu_ledger``)
        self._admission_part = ledger.part("admission")
        self._page_part = ledger.part("page")
        # Unanswered requests (samples) and their input bytes bound memory under any flood and policy; the
        # event loop's lag, the controller's CPU (by default half the default SLO: a loop that late leaves
        # requests little of their time).
        lag_ms = max_loop_lag_ms if max_loop_lag_ms is not None else default_slo_ms / 2
        self.load_limits = ServerLoadLimits(max_outstanding, max_outstanding_bytes, round(lag_ms * 1e6))
        self.policy_name = policy
        self.default_slo_ns = round(default_slo_ms * 1e6)
        self.margin_ns = margin_ns = round(deadline_margin_ms * 1e6)  # every request's result is due this early
        scheduler = make_scheduler(policy, {}, [], random.Random(seed), margin_ns, policy_settings, "policy settings")
        if not isinstance(scheduler, Membership):
            raise ValueError(f"policy {policy!r} cannot serve live: devices and models must be able to come and go")
        self._membership: Membership = scheduler
        self.metrics = ServingMetrics()
        # The simulator's request and action logs, for ``mainspring analyze``.
        self.logs = LogWriter(log_dir, f"live-{time.strftime('%Y%m%d-%H%M%S')}") if log_dir is not None else None
        self.timeline = Timeline()  # the live page's last seconds of every lane
        self.model_window = ModelWindow()  # and its per-model panel
        observers: tuple[ControllerObserver, ...] = (self.metrics, self.timeline, self.model_window)
        observers += () if self.logs is None else (self.logs,)
        # Spans for the requests whose calls carry a sampled traceparent (``infer``'s ``traceparent``).
        self.traces: RequestTraces | None = None
        if tracing is not None:
            self.traces = tracing.observer(self.clock, _predictor(scheduler))
            observers += (self.traces,)
        observer: ControllerObserver = Observers(*observers)
        self.connected = WorkerSet()
        self._output_specs: dict[str, tuple[TensorSpec, ...]] = {}  # by model key: what results are checked by
        self.controller = Controller(
            scheduler,
            self.clock,
            self.connected.links,
            self._answer,
            self._request_wakeup,
            observer,
            send_inputs=True,
            defer=self._soon,
            output_specs=self._output_specs.get,
            ledger=ledger,
        )
        self._request_ids = itertools.count(1)
        self._calls: dict[int, tuple[_Call, int]] = {}  # request id -> its call, and its place in the call
        self._open: collections.Counter[str] = collections.Counter()  # unanswered requests per model key
        self.lifecycle = ModelLifecycle(self)
        # What the transports report (joins, results, losses) goes there; it drops misbehaving workers.
        self.worker_events = WorkerEventHandler(self, watchdog_grace_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.accepting = True
        self.in_line = True  # a cell restarted (or started) is not, until the server says (``CellsPort``)
        # Told when models, devices or acceptance change (frontend processes keep a copy of that state).
        self.state_listeners: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._announcements: set[asyncio.Task[None]] = set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    @property
    def models(self) -> dict[str, ServedModel]:
        """The served models by the name clients use (``ModelLifecycle``)."""
        return self.lifecycle.models

    @property
    def load_errors(self) -> dict[str, str]:
        """Why a model of the repository is not served, by name."""
        return self.lifecycle.load_errors

    def open_count(self, key: str) -> int:
        """Requests admitted for model ``key`` and not answered yet."""
        return self._open[key]

    @property
    def policy(self) -> Membership:
        """The policy (read by a cell's load signal; the controller alone calls it)."""
        return self._membership

    @property
    def workers(self) -> list[WorkerHandle]:
        return self.connected.handles

    @property
    def device_count(self) -> int:
        return len(self.connected.links)

    @property
    def pool_bytes(self) -> int:
        """The connected devices' weight pools together (a cell's capacity in the cells' plan)."""
        return sum(spec.total_pages * spec.page_bytes for spec in self.connected.specs.values())

    @property
    def device_ids(self) -> list[int]:
        """The connected devices (the controller's ids)."""
        return sorted(self.connected.links)

    # --- clients ------------------------------------------------------------------------------
    async def infer(
        self, model: str, samples: Sequence[Sample], slo_ns: int, waited_ns: int = 0, traceparent: str = ""
    ) -> list[Answer]:
        """Submit one request per sample (all with the same deadline, ``slo_ns`` from when the call's first byte
        was read: ``waited_ns`` ago) and wait for every answer. ``traceparent``: the frontend's span of a
        sampled call, under which its requests are traced (when tracing is on here)."""
        answered: asyncio.Future[list[Answer]] = self.loop.create_future()

        def done(answers: list[Answer]) -> None:
            if not answered.done():  # not when its caller was cancelled
                answered.set_result(answers)

        self.submit(model, samples, slo_ns, waited_ns, done, traceparent)
        return await answered

    def submit(
        self,
        model: str,
        samples: Sequence[Sample],
        slo_ns: int,
        waited_ns: int,
        done: Callable[[list[Answer]], None],
        traceparent: str = "",
    ) -> None:
        """``infer`` without a coroutine: ``done`` gets every answer, in sample order, when the last is made
        (called on the answer's own path, once). ``ServiceError`` for a call refused as a whole."""
        with self._admission_part:
            self._admit(model, samples, slo_ns, waited_ns, done, traceparent)

    def _admit(
        self,
        model: str,
        samples: Sequence[Sample],
        slo_ns: int,
        waited_ns: int,
        done: Callable[[list[Answer]], None],
        traceparent: str,
    ) -> None:
        if not self.accepting:
            raise ServiceError("unavailable", "the server is shutting down")
        served = self.models.get(model)
        if served is None:
            raise ServiceError("not_found", f"unknown model {model!r}")
        if model in self.lifecycle.unloading:
            raise ServiceError("unavailable", f"model {model!r} is being unloaded")
        size = sum(int(array.nbytes) for sample in samples for array in sample.values()) // max(len(samples), 1)
        refusal = self.load_limits.refusal(len(samples), size)
        if refusal is not None:
            self.metrics.rejections.labels(Outcome.OVERLOADED.value).inc(len(samples))
            self.metrics.triton.refused(served.key, len(samples))
            raise ServiceError("overloaded", f"overloaded: {refusal}")
        self._output_specs[served.key] = served.config.outputs  # what its results must hold
        arrival = self.clock.now_ns() - max(0, waited_ns)
        call = _Call(len(samples), done)
        for index, sample in enumerate(samples):
            request = Request.arriving(next(self._request_ids), served.key, arrival, slo_ns, self.margin_ns, sample)
            self._calls[request.id] = (call, index)
            self._open[served.key] += 1
            self.load_limits.admit(request.id, size)
            if traceparent and self.traces is not None:
                self.traces.follow(request.id, traceparent)
            self.controller.submit(request)

    def _answer(self, request: Request, response: Response, output: object) -> None:
        entry = self._calls.pop(request.id, None)
        if entry is not None:
            self.load_limits.release(request.id)
            left = self._open[request.model] - 1
            if left > 0:
                self._open[request.model] = left
            else:
                del self._open[request.model]
            call, index = entry
            call.answered(index, (response, output))

    def _soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    def _request_wakeup(self, at_ns: int) -> None:
        self.timer.call_at(at_ns, self.controller.wake)

    def update_gauges(self) -> None:
        self.metrics.workers.set(len(self.connected))
        self.metrics.devices.set(self.device_count)
        self.metrics.models.set(len(self.models))

    def announce_soon(self) -> None:
        """Tell the listeners of a change made where nothing can wait for them (a worker joining or lost)."""
        for listener in self.state_listeners:
            task = self.loop.create_task(listener())
            self._announcements.add(task)
            task.add_done_callback(self._announcements.discard)

    async def announce(self) -> None:
        """Tell the listeners now: they know before the caller of a load, unload or drain hears it is done."""
        for listener in self.state_listeners:
            await listener()

    async def warm(self, model: str) -> bool:
        """Load a served model's weights onto a device before its requests come (a cell taking a model
        over from another); False when the policy cannot (held already, or a policy without warming)."""
        served = self.models.get(model)
        if served is None:
            raise ServiceError("not_found", f"unknown model {model!r}")
        if not isinstance(self._membership, Warms) or not self._membership.warm(served.key):
            return False
        self.controller.pump()
        return True

    # --- what a frontend reads besides inference (``frontend/port.py``) --------------------------
    async def refresh(self) -> bool:
        return False  # this is the controller: its view is the current one

    async def model_statistics(self, model: str) -> ModelStats:
        return self.metrics.stats(model)

    async def exposition(self) -> bytes:
        """The Prometheus metrics, in the text format."""
        self.metrics.loop_lag.set(self.load_limits.loop_lag_ns / NS_PER_S)
        self.metrics.host.gpus = tuple(gpu for handle in self.connected.handles for gpu in handle.gpus)
        if self.ledger is not NO_LEDGER:
            for part, ns in [*self.ledger.ns.items(), ("unattributed", self.ledger.unattributed_ns())]:
                self.metrics.controller_cpu.labels(part).set(ns / NS_PER_S)
        return self.metrics.exposition(self.clock.now_ns())

    def count_dropped_client(self, transport: str, cause: str, frontend: str = "main", count: int = 1) -> None:
        if cause == SHED:  # refused at arrival, before the call was read: a rejection, not a client gone
            self.metrics.rejections.labels(Outcome.OVERLOADED.value).inc(count)
        else:
            self.metrics.client_disconnects.labels(frontend, transport, cause).inc(count)

    async def timeline_view(self, seconds: float, cursor: str = "") -> dict[str, Any]:
        with self._page_part:  # the live page's poll, in this process's frontend (``dashboard_cost.py``)
            return self.page_view(seconds, cursor)

    def page_view(self, seconds: float, cursor: str = "") -> dict[str, Any]:
        """The live page's data (``telemetry.live_view``): what happened over the last ``seconds``, or since the
        poll that gave ``cursor``; the next poll's cursor."""
        now = self.clock.now_ns()
        default_slo_ms = self.default_slo_ns / 1e6
        served = {m.key: (name, m.profile, m.config.slo_ms or default_slo_ms) for name, m in self.models.items()}
        since = horizon_since(now, seconds, cursor)
        stats = self.metrics.model_stats  # by name, as clients know it
        used = {m.key: stats[name].last_inference_ns for name, m in self.models.items() if name in stats}
        last_used = {key: ns for key, ns in used.items() if ns}  # 0: never served
        view = page_view(self.timeline, self.model_window, now, since, served, self.connected.specs,
                         self.load_limits.loop_lag_ns, last_used)  # fmt: skip
        return {"seconds": seconds, "cursor": str(now), "views": [view]}

    # --- repository ---------------------------------------------------------------------------
    async def load_model(self, model: str, timeout_s: float = 120.0) -> None:
        await self.lifecycle.load(model, timeout_s)

    async def reload_model(self, model: str, timeout_s: float = 120.0) -> None:
        """Serve the repository's changed entry for a served model without refusing its requests meanwhile."""
        await self.lifecycle.reload(model, timeout_s)

    async def unload_model(self, model: str, timeout_s: float = 60.0) -> None:
        await self.lifecycle.unload(model, timeout_s)

    # --- shutdown -----------------------------------------------------------------------------
    async def drain(self, timeout_s: float) -> int:
        """Stop accepting; wait up to ``timeout_s`` for outstanding requests, then answer the rest with an error."""
        self.accepting = False
        await self.announce()
        self.worker_events.stop()
        deadline = self.clock.now_ns() + round(timeout_s * NS_PER_S)
        while self.controller.outstanding and self.clock.now_ns() < deadline:
            await asyncio.sleep(0.01)
        self.load_limits.stop()
        left = self.controller.shutdown("the server is shutting down")
        for handle in self.connected.handles:
            handle.close("controller shutting down")
        if self.logs is not None:
            self.logs.close()
        return left


def _predictor(scheduler: object) -> Callable[[str, int], int | None] | None:
    """When a request of a model arriving now could finish at the earliest, as the policy forecasts it (a
    batch of one on a device holding it, after the work booked there); None for a policy without forecasts."""
    if not isinstance(scheduler, Forecasts):
        return None
    forecasts = scheduler
    return lambda model, now_ns: forecasts.forecast((model,), now_ns).finish_ns.get(model)


class _Call:
    """One client call's answers, in sample order; ``done`` gets them once the last is made."""

    __slots__ = ("answers", "done", "left")

    def __init__(self, samples: int, done: Callable[[list[Answer]], None]) -> None:
        self.answers: list[Answer | None] = [None] * samples
        self.left = samples
        self.done = done

    def answered(self, index: int, answer: Answer) -> None:
        self.answers[index] = answer
        self.left -= 1
        if self.left == 0:
            try:
                self.done(cast("list[Answer]", self.answers))
            except Exception:  # a caller's failure must not stop the pass that answered it
                log.exception("could not hand a call its answers")
