"""One real device (a CPU arena or a CUDA GPU) running actions with PyTorch.

Weights of every registered model stay in host memory (pinned on CUDA). The device
allocates its page pool once, as one arena (a GPU's once its models are registered:
``open_pool``); ``LoadWeights`` copies a model's tensors
into pages (first-fit-decreasing, never straddling a page) and points the module's
parameters at those page views, so inference reads the weights from the pages and no
other copy is made. ``EvictWeights`` returns the pages. Each load is a new
``Residency``; an inference that finds a different one when it ends (its model was
evicted or reloaded meanwhile) reports an error instead of outputs that may be wrong.

On CUDA a load's CUDA graphs (one per batch size) are captured after its result is out, a batch
size at a time while no load is due within 50 ms (``Lane.when_idle``): a load takes what its
profile predicts (a copy), and the model runs eagerly until its graphs are in. Captures run on
a stream of their own and every graph of the device draws from one shared memory pool (replays are
serial on the exec stream, so graphs may share scratch memory). A batch size that fails to
capture is not tried again at later loads. Warm-up runs on a stream of its own, never between
the exec lane's timed inferences. A CUDA error that poisons the context (a device-side assert,
an illegal address) cannot be recovered in the process: the device refuses all work from then
on and ``on_lost`` is told, so that the worker process starts over.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import numpy as np
import torch
from torch import nn

from mainspring.protocol import (
    Action,
    ActionResult,
    ActionStatus,
    DeviceSpec,
    EvictWeights,
    Infer,
    LoadWeights,
    Timing,
    action_kind,
)
from mainspring.protocol.tensors import Sample, numpy_dtype
from mainspring.time import Clock
from mainspring.worker.executor import Lane, ResultSink
from mainspring.worker.pages import PagePool
from mainspring.worker.runtimes.batches import as_tuple, check_batch, check_outputs
from mainspring.worker.runtimes.cuda_graphs import GraphCapture, is_sticky_cuda_error
from mainspring.worker.runtimes.host_weights import HostModel, drop_weights
from mainspring.worker.runtimes.input_buffers import SharedInputs, new_buffers

log = logging.getLogger(__name__)

_T = TypeVar("_T")

CAPTURE_GAP_NS = 50_000_000  # a capture takes milliseconds: not started when a load is due sooner than this


@dataclass(frozen=True)
class ExecSettings:
    """What makes CPU execution predictable; each measured by ``benchmarks/cpu_exec_settings.py``."""

    intra_op_threads: int | None = 1  # None leaves torch's default (all cores)
    pin_core: int | None = None  # pin the exec lane's thread to this CPU core (one core per worker on a host)
    inference_mode: bool = True
    warmup_runs: int = 3
    cuda_graphs: bool = True


@dataclass
class Residency:
    """One load of one model: the page views its parameters point at (and CUDA graphs captured on them)."""

    views: tuple[torch.Tensor, ...]
    graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = field(default_factory=dict)


@dataclass
class _Binding:
    """A model's module on this device, its parameter objects (in ``HostModel.names`` order) and input
    buffers (its own while it warms up, then the ones it shares on the exec lane: ``input_buffers``)."""

    model: HostModel
    module: nn.Module
    params: tuple[torch.Tensor, ...]
    inputs: dict[int, tuple[torch.Tensor, ...]]


class TorchDevice:
    """Page pool, resident models and the exec and weight-load lanes of one device."""

    def __init__(
        self,
        spec: DeviceSpec,
        torch_device: torch.device,
        clock: Clock,
        sink: ResultSink,
        settings: ExecSettings,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.device = torch_device
        self.settings = settings
        self._clock = clock
        self._cuda = torch_device.type == "cuda"
        self.pool = PagePool(spec.page_bytes, spec.page_bytes)  # until ``open_pool``
        self._arena = torch.empty(0, dtype=torch.uint8, device=torch_device)
        self.pool_open = False
        if spec.pool_bytes:
            self.open_pool(spec.pool_bytes)
        self.activation_peaks: dict[str, int] = {}  # CUDA: bytes a model's warm-up took beyond its weights
        self._bindings: dict[str, _Binding] = {}
        self.inputs = SharedInputs(torch_device, self._inference)
        self._resident: dict[str, Residency] = {}
        self._served: set[str] = set()  # models that have answered some input here: a failure is then the input's
        self._exec_stream = _stream(torch_device) if self._cuda else None
        self._load_stream = _stream(torch_device) if self._cuda else None
        self._warmup_stream = _stream(torch_device) if self._cuda else None
        self.graphs = GraphCapture(torch_device, _stream(torch_device) if self._cuda else None)
        self.lost = ""  # why the CUDA context is unusable, once it is
        self._lost_by: int | None = None  # the action whose result says so (the worker is told after it)
        self._lost_lock = threading.Lock()
        self._sink = sink
        self._on_lost = on_lost
        pin = _pin_to_core(settings.pin_core) if settings.pin_core is not None else None
        self._exec_lane = Lane(f"exec-{spec.device}", clock, self._run_exec, self._deliver, on_thread_start=pin)
        # Captures run on the load lane when the next load is at least this far off (or none is queued).
        self._load_lane = Lane(f"load-{spec.device}", clock, self._run_load, self._deliver, idle_gap_ns=CAPTURE_GAP_NS)

    def open_pool(self, pool_bytes: int) -> None:
        """Allocate the page pool (once; a pool of 0 bytes in the spec waits for this: its size is then known
        only once the models are registered, ``device_memory.py``)."""
        assert not self.pool_open, "the page pool is open already"
        self.spec = msgspec.structs.replace(self.spec, pool_bytes=pool_bytes)
        self.pool = PagePool(pool_bytes, self.spec.page_bytes)
        self._arena = torch.empty(self.pool.total_pages * self.spec.page_bytes, dtype=torch.uint8, device=self.device)
        self._arena.zero_()  # touch every page now: a first-touch page fault would make the first loads slow
        if self._cuda:  # the load stream does not wait for the default one: no load may land before the zeros
            torch.cuda.synchronize(self.device)
        self.pool_open = True

    @property
    def resident_models(self) -> frozenset[str]:
        return frozenset(self._resident)

    def submit(self, action: Action, inputs: Sequence[Sample] | None = None) -> None:
        lane = self._exec_lane if isinstance(action, Infer) else self._load_lane
        lane.submit(action, inputs)

    def close(self) -> None:
        self._exec_lane.close()
        self._load_lane.close()

    def settle(self, timeout_s: float = 60.0) -> bool:
        """Wait until the loads' CUDA graph captures are done (measuring exec times meanwhile mixes eager runs
        with replays, and a capture's synchronize); False if they are not within ``timeout_s``."""
        return self._load_lane.wait_for_idle_work(timeout_s)

    def _deliver(self, result: ActionResult) -> None:
        """The lanes' results go out; the one that says the context is lost, before the worker is told."""
        self._sink(result)
        if self.lost and result.action_id == self._lost_by:
            self._tell_lost()

    def _lose(self, error: BaseException, where: str, action: Action | None = None) -> str:
        """The CUDA context is poisoned (``error``, met ``where``): refuse everything from now on, and tell the
        worker once ``action``'s result is out (at once when no action's result says so)."""
        with self._lost_lock:
            if not self.lost:
                cause = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
                self.lost = (
                    f"the CUDA context of {self.device} is lost ({cause}); the worker starts over. "
                    "An input outside a model's range is the usual cause: declare valid_range in its config"
                )
                self._lost_by = None if action is None else action.action_id
                log.critical("%s (%s)", self.lost, where)
        if action is None:
            self._tell_lost()
        return self.lost

    def _tell_lost(self) -> None:
        with self._lost_lock:
            on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None:
            on_lost(self.lost)

    # -- registration -----------------------------------------------------------------------------------------

    def add(self, model: HostModel, module: nn.Module) -> dict[int, list[int]]:
        """Bind ``module`` to this device; warm up every batch size; returns the measured exec times (ns)."""
        params_by_name = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        params = tuple(params_by_name[name] for name in model.names)
        config = model.config
        with self._inference():  # the warm-up's own: the exec lane may be using the shared ones meanwhile
            own = {b: new_buffers(config, b, self.device) for b in config.batch_sizes}
        binding = _Binding(model, module, params, own)
        # Warm up on temporary weights on the device: the pool is the controller's to fill.
        try:
            if self._cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
                before = torch.cuda.memory_allocated(self.device)
            self._bind(binding, tuple(h.to(self.device) for h in model.host))
            timings = {b: self._warm_up(binding, b) for b in config.batch_sizes}
            if self._cuda:
                peak = torch.cuda.max_memory_allocated(self.device) - before - model.weights_bytes
                self.activation_peaks[config.name] = max(0, peak)
        except Exception as error:
            if is_sticky_cuda_error(error):
                self._lose(error, f"registering {config.name}")
            raise
        self._bind(binding, model.host)
        binding.inputs = self.inputs.take(config)
        self._bindings[config.name] = binding
        if not model.layout:  # no weights to page: resident from now on, never loaded or evicted
            self._resident[config.name] = Residency(())
        return timings

    def remove(self, model: str) -> None:
        binding = self._bindings.pop(model, None)
        if binding is not None:
            self.inputs.release(binding.model.config)
            drop_weights(binding.module)  # now, not at the cycle collection that frees an exported module
        self._resident.pop(model, None)
        self._served.discard(model)
        self.activation_peaks.pop(model, None)
        self.graphs.forget(model)
        self.pool.release(model)

    def _warm_up(self, binding: _Binding, batch: int) -> list[int]:
        """Run the whole infer path (input copies, forward, outputs to host) on zero inputs; returns the times."""
        samples = [
            {s.name: np.zeros((1, *s.sample_shape), dtype=numpy_dtype(s.datatype)) for s in binding.model.config.inputs}
            for _ in range(batch)
        ]
        durations = []
        for _ in range(max(1, self.settings.warmup_runs) + 1):
            begin = self._clock.now_ns()
            outputs = self._forward(binding, None, batch, samples, self._warmup_stream)
            self._to_host(outputs, self._warmup_stream)
            self._synchronize(self._warmup_stream)
            durations.append(self._clock.now_ns() - begin)
        check_outputs(binding.model.config, outputs, batch)
        return durations[1:]

    # -- the lanes ----------------------------------------------------------------------------------------------

    def _run_load(self, action: Action, _: object) -> ActionResult:
        if self.lost:
            return self._refuse(action, ActionStatus.ERROR, self.lost)
        if isinstance(action, EvictWeights):
            return self._evict(action)
        assert isinstance(action, LoadWeights)
        binding = self._bindings.get(action.model)
        if binding is None:
            return self._refuse(action, ActionStatus.ERROR, f"model {action.model!r} is not registered on this worker")
        if not binding.model.layout:  # nothing to page: it is resident since it registered
            now = self._clock.now_ns()
            return ActionResult(action.action_id, action.device, ActionStatus.OK, Timing(now, now))
        if not self.pool_open:
            return self._refuse(action, ActionStatus.ERROR, "the page pool is not allocated yet")
        if action.model in self._resident:
            return self._refuse(action, ActionStatus.ERROR, f"{action.model} is already resident")
        pages = len(binding.model.layout)
        if not self.pool.allocate(action.model, pages):
            free = self.pool.free_pages
            return self._refuse(action, ActionStatus.OUT_OF_MEMORY, f"{action.model} needs {pages} pages, {free} free")

        def load() -> Residency:
            views = self._views(binding.model, self.pool.page_numbers(action.model))
            self._copy(views, binding.model.host)
            self._bind(binding, views)
            return Residency(views)

        try:
            timing, residency = self._timed(self._load_stream, load)
        except Exception as error:  # the lane answers any other failure with an ERROR
            if is_sticky_cuda_error(error):
                return self._lose_context(action, error)
            raise
        self._resident[action.model] = residency
        if self._cuda and self.settings.cuda_graphs and getattr(binding.module, "cuda_graphs", True):
            for batch in binding.inputs:  # after the result, while the lane has nothing due: not the load's time
                if self.graphs.wanted(action.model, batch):
                    self._load_lane.when_idle(functools.partial(self._capture_graph, binding, residency, batch))
        return ActionResult(action.action_id, action.device, ActionStatus.OK, timing)

    def _evict(self, action: EvictWeights) -> ActionResult:
        if action.model not in self._resident:
            return self._refuse(action, ActionStatus.NOT_RESIDENT, f"{action.model} is not resident")
        begin = self._clock.now_ns()
        binding = self._bindings.get(action.model)
        if binding is not None and not binding.model.layout:  # frees nothing: stays resident
            return ActionResult(action.action_id, action.device, ActionStatus.OK, Timing(begin, begin))
        del self._resident[action.model]
        self.pool.release(action.model)
        return ActionResult(action.action_id, action.device, ActionStatus.OK, Timing(begin, self._clock.now_ns()))

    def _run_exec(self, action: Action, samples: Sequence[Sample] | None) -> ActionResult:
        assert isinstance(action, Infer)
        if self.lost:
            return self._refuse(action, ActionStatus.ERROR, self.lost)
        binding = self._bindings.get(action.model)
        if binding is None:
            return self._refuse(action, ActionStatus.ERROR, f"model {action.model!r} is not registered on this worker")
        residency = self._resident.get(action.model)
        if residency is None:
            return self._refuse(action, ActionStatus.NOT_RESIDENT, f"{action.model} is not resident")
        problem = check_batch(binding.model.config, action, samples)
        if problem:
            return self._refuse(action, ActionStatus.ERROR, problem)
        assert samples is not None

        def infer() -> list[np.ndarray[Any, Any]]:
            return self._to_host(self._forward(binding, residency, action.batch_size, samples))

        try:
            timing, arrays = self._timed(self._exec_stream, infer)
        except Exception as error:  # an input the model cannot take, or a model that fails on every input
            if is_sticky_cuda_error(error):  # nothing runs in this process any more: not even each request alone
                return self._lose_context(action, error)
            return self._isolate(action, binding, residency, samples, error)
        if self._resident.get(action.model) is not residency:
            return self._discarded(action, timing)
        self._served.add(action.model)
        names = [spec.name for spec in binding.model.config.outputs]
        per_request: list[object] = [
            {name: np.array(array[i : i + 1]) for name, array in zip(names, arrays, strict=True)}
            for i in range(len(samples))
        ]
        return ActionResult(action.action_id, action.device, ActionStatus.OK, timing, outputs=per_request)

    def _isolate(
        self, action: Infer, binding: _Binding, residency: Residency, samples: Sequence[Sample], error: Exception
    ) -> ActionResult:
        """The batch failed: run each request alone while its deadline allows (``Infer.deadlines_ns``),
        so that only those whose own input fails get the error; the ones left ``unchecked`` get the
        batch's. The model is at fault (an ``ERROR`` for the whole batch) when every request run
        alone fails, more than one of them, or a lone one before the model has served any input."""
        begin = self._clock.now_ns()
        message = f"{type(error).__name__}: {error}"
        names = [spec.name for spec in binding.model.config.outputs]
        outputs: list[object] = []
        failed: dict[int, str] = {}
        unchecked: list[int] = []
        longest_alone: int | None = None  # until one has run alone, the batch's duration bounds it
        for index, sample in enumerate(samples):
            outputs.append({})
            if len(samples) == 1:  # it has just failed alone
                failed[index] = message
                break
            started = self._clock.now_ns()
            alone_ns = action.expected_duration_ns if longest_alone is None else longest_alone
            if action.deadlines_ns and started + alone_ns > action.deadlines_ns[index]:
                unchecked.append(index)
                continue
            try:
                arrays = self._to_host(self._forward(binding, residency, min(binding.inputs), [sample]))
                outputs[-1] = {name: np.array(array[0:1]) for name, array in zip(names, arrays, strict=True)}
            except Exception as alone:
                if is_sticky_cuda_error(alone):
                    return self._lose_context(action, alone)
                failed[index] = f"{type(alone).__name__}: {alone}"
            longest_alone = max(longest_alone or 0, self._clock.now_ns() - started)
        timing = Timing(begin, self._clock.now_ns())
        if self._resident.get(action.model) is not residency:
            return self._discarded(action, timing)
        ran = len(samples) - len(unchecked)
        if ran and len(failed) == ran and (ran > 1 or action.model not in self._served):
            return ActionResult(action.action_id, action.device, ActionStatus.ERROR, timing, message)
        if len(failed) < ran:
            self._served.add(action.model)
        return ActionResult(
            action.action_id, action.device, ActionStatus.OK, timing, message, outputs, failed, tuple(unchecked)
        )

    def _lose_context(self, action: Action, error: Exception) -> ActionResult:
        """The action that met a poisoned context fails whole (for a batch, which request did it cannot be
        learnt here any more: nothing runs); every later action is refused (``_lose``)."""
        reason = self._lose(error, f"{action_kind(action)} {action.model}", action)
        return self._refuse(action, ActionStatus.ERROR, reason)

    @staticmethod
    def _discarded(action: Infer, timing: Timing) -> ActionResult:
        message = f"weights of {action.model} were evicted or reloaded during the inference; outputs discarded"
        return ActionResult(action.action_id, action.device, ActionStatus.ERROR, timing, message)

    # -- the work -------------------------------------------------------------------------------------------------

    def _forward(
        self,
        binding: _Binding,
        residency: Residency | None,
        batch: int,
        samples: Sequence[Sample] = (),
        stream: torch.cuda.Stream | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Copy ``samples`` into the batch's input buffers and run it, on ``stream`` (default: the exec stream)."""
        buffers = binding.inputs[batch]
        with self._inference(), _on(stream or self._exec_stream):
            for i, sample in enumerate(samples):
                for spec, buffer in zip(binding.model.config.inputs, buffers, strict=True):
                    buffer[i : i + 1].copy_(torch.from_numpy(sample[spec.name]), non_blocking=self._cuda)
            if len(samples) < batch:
                # The padding rows may hold another model's inputs (the buffers are shared): token ids
                # past this model's vocabulary would fail the batch, or assert on a GPU. Zeros warmed it up.
                for buffer in buffers:
                    buffer[len(samples) :].zero_()
            graph = residency.graphs.get(batch) if residency is not None else None
            if graph is not None:
                graph[0].replay()
                return graph[1]
            return as_tuple(binding.module(*buffers))

    def _to_host(
        self, outputs: tuple[torch.Tensor, ...], stream: torch.cuda.Stream | None = None
    ) -> list[np.ndarray[Any, Any]]:
        """Copy outputs to host memory on ``stream`` (default: the exec stream), after the kernels that wrote them."""
        with _on(stream or self._exec_stream):
            return [o.cpu().numpy() for o in outputs]

    def _views(self, model: HostModel, pages: list[int]) -> tuple[torch.Tensor, ...]:
        views: list[torch.Tensor | None] = [None] * len(model.host)
        page_bytes = self.spec.page_bytes
        for page, members in zip(pages, model.layout, strict=True):
            offset = page * page_bytes
            for index in members:
                host = model.host[index]
                nbytes = host.numel() * host.element_size()
                views[index] = self._arena[offset : offset + nbytes].view(host.dtype).view(host.shape)
                offset += model.tensor_bytes[index]
        return tuple(v for v in views if v is not None)

    def _copy(self, views: Sequence[torch.Tensor], host: Sequence[torch.Tensor]) -> None:
        with torch.no_grad(), _on(self._load_stream):
            for view, tensor in zip(views, host, strict=True):
                view.copy_(tensor, non_blocking=self._cuda)

    @staticmethod
    def _bind(binding: _Binding, tensors: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for param, tensor in zip(binding.params, tensors, strict=True):
                param.data = tensor

    def _capture_graph(self, binding: _Binding, residency: Residency, batch: int) -> None:
        """Capture one batch size of a load as a CUDA graph (on the load lane, when idle; ``GraphCapture``)."""
        config = binding.model.config
        if self._resident.get(config.name) is not residency or self.lost:  # evicted or reloaded since
            return
        zeros = new_buffers(config, batch, self.device)  # the shared buffers may hold another model's inputs now

        def current() -> bool:
            return self._resident.get(config.name) is residency

        try:
            graph = self.graphs.capture(
                config.name, batch, binding.module, zeros, binding.inputs[batch], as_tuple, current
            )
        except RuntimeError as error:  # sticky: the context is gone
            self._lose(error, f"capturing {config.name} batch {batch}")
            return
        if graph is not None and self._resident.get(config.name) is residency:
            residency.graphs[batch] = graph

    def _timed(self, stream: torch.cuda.Stream | None, work: Callable[[], _T]) -> tuple[Timing, _T]:
        """Run ``work``; on CUDA its duration comes from events on ``stream``, not from host timers."""
        begin = self._clock.now_ns()
        if stream is None:
            result = work()
            return Timing(begin, self._clock.now_ns()), result
        start, end = _timing_event(), _timing_event()
        start.record(stream)
        result = work()
        end.record(stream)
        end.synchronize()
        return Timing(begin, begin + round(start.elapsed_time(end) * 1e6)), result

    def _synchronize(self, stream: torch.cuda.Stream | None = None) -> None:
        if self._cuda:
            (stream or self._exec_stream or torch.cuda.current_stream(self.device)).synchronize()

    def _inference(self) -> Any:
        return torch.inference_mode() if self.settings.inference_mode else torch.no_grad()

    @staticmethod
    def _refuse(action: Action, status: ActionStatus, message: str) -> ActionResult:
        return ActionResult(action.action_id, action.device, status, None, message)


def _stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def _timing_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def _pin_to_core(core: int) -> Callable[[], None]:
    def pin() -> None:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[core % len(cores)]})  # the calling thread only (Linux)

    return pin


def _on(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager[object]:
    """Work issued inside runs on ``stream`` (CUDA); nothing changes on the CPU."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
