"""One real device (a CPU arena or a CUDA GPU) running actions with PyTorch.

Weights of every registered model stay in host memory (pinned on CUDA). ``LoadWeights`` copies a
model's tensors into pages of the device's pool (``weight_arena.py``) and points the module's
parameters at those page views; ``EvictWeights`` returns the pages. Each load is a new ``Residency``;
an inference that finds a different one when it ends (its model was evicted or reloaded meanwhile)
reports an error instead of outputs that may be wrong. A failed batch's requests run alone
(``failed_batch.py``).

On CUDA a load's CUDA graphs (one per batch size) are captured after its result is out, a batch
size at a time while no load is due within 50 ms (``Lane.when_idle``): a load takes what its
profile predicts (a copy), and the model runs eagerly until its graphs are in. Captures run on
a stream of their own and every graph of the device draws from one shared memory pool (replays are
serial on the exec stream, so graphs may share scratch memory). A batch size that fails to
capture is not tried again at later loads. Warm-up runs on a stream of its own, never between
the exec lane's timed inferences. A CUDA error that poisons the context refuses all work from then
on and starts the worker over (``lost_context.py``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
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
from mainspring.worker.runtimes.failed_batch import run_alone
from mainspring.worker.runtimes.host_weights import HostModel, drop_weights
from mainspring.worker.runtimes.input_buffers import SharedInputs, new_buffers
from mainspring.worker.runtimes.lost_context import LostContext
from mainspring.worker.runtimes.weight_arena import WeightArena

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
        self.arena = WeightArena(torch_device, spec.page_bytes)
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
        self.lost_context = LostContext(torch_device, on_lost)
        self._sink = sink
        pin = _pin_to_core(settings.pin_core) if settings.pin_core is not None else None
        self._exec_lane = Lane(f"exec-{spec.device}", clock, self._run_exec, self._deliver, on_thread_start=pin)
        # Captures run on the load lane when the next load is at least this far off (or none is queued).
        self._load_lane = Lane(f"load-{spec.device}", clock, self._run_load, self._deliver, idle_gap_ns=CAPTURE_GAP_NS)

    def open_pool(self, pool_bytes: int) -> None:
        """Allocate the page pool (once; a pool of 0 bytes in the spec waits for this: its size is then known
        only once the models are registered, ``device_memory.py``)."""
        self.arena.open(pool_bytes)
        self.spec = msgspec.structs.replace(self.spec, pool_bytes=pool_bytes)

    @property
    def pool(self) -> PagePool:
        return self.arena.pool

    @property
    def pool_open(self) -> bool:
        return self.arena.is_open

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
        self.lost_context.delivered(result.action_id)

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
                self.lost_context.lose(error, f"registering {config.name}")
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
        if self.lost_context.reason:
            return self._refuse(action, ActionStatus.ERROR, self.lost_context.reason)
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
            views = self.arena.views(binding.model)
            self.arena.copy_in(views, binding.model.host, self._load_stream)
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
        if self.lost_context.reason:
            return self._refuse(action, ActionStatus.ERROR, self.lost_context.reason)
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
        """The batch failed: its requests run alone, to tell whose input is at fault (``failed_batch.py``)."""
        names = [spec.name for spec in binding.model.config.outputs]

        def run_one(sample: Sample) -> object:
            arrays = self._to_host(self._forward(binding, residency, min(binding.inputs), [sample]))
            return {name: np.array(array[0:1]) for name, array in zip(names, arrays, strict=True)}

        try:
            alone = run_alone(action, samples, error, run_one, self._clock)
        except Exception as lost:  # a CUDA error that lost the context: nothing runs any more
            if is_sticky_cuda_error(lost):
                return self._lose_context(action, lost)
            raise
        if self._resident.get(action.model) is not residency:
            return self._discarded(action, alone.timing)
        result = alone.result(action, served_before=action.model in self._served)
        if alone.any_answered:
            self._served.add(action.model)
        return result

    def _lose_context(self, action: Action, error: Exception) -> ActionResult:
        """The action that met a poisoned context fails whole (for a batch, which request did it cannot be
        learnt here any more: nothing runs); every later action is refused (``LostContext``)."""
        reason = self.lost_context.lose(error, f"{action_kind(action)} {action.model}", action.action_id)
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

    @staticmethod
    def _bind(binding: _Binding, tensors: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for param, tensor in zip(binding.params, tensors, strict=True):
                param.data = tensor

    def _capture_graph(self, binding: _Binding, residency: Residency, batch: int) -> None:
        """Capture one batch size of a load as a CUDA graph (on the load lane, when idle; ``GraphCapture``)."""
        config = binding.model.config
        if self._resident.get(config.name) is not residency or self.lost_context.reason:  # evicted or reloaded since
            return
        zeros = new_buffers(config, batch, self.device)  # the shared buffers may hold another model's inputs now

        def current() -> bool:
            return self._resident.get(config.name) is residency

        try:
            graph = self.graphs.capture(
                config.name, batch, binding.module, zeros, binding.inputs[batch], as_tuple, current
            )
        except RuntimeError as error:  # sticky: the context is gone
            self.lost_context.lose(error, f"capturing {config.name} batch {batch}")
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
