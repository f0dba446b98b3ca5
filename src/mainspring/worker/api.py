"""The in-process worker interface, and the emulated runtime behind it in real time.

A ``Worker`` announces its devices and the profiles of the models it serves, takes
actions (with the inputs of each request for an ``Infer``) and delivers every result
through the callback it was built with, from its own threads. The torch runtime
(``TorchWorker``) and ``EmulatedWorker`` implement the same interface, so the network
worker and the tests of the live system use either.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from mainspring.models.profile import ModelProfile
from mainspring.models.repository import ModelConfig, ModelLoadError
from mainspring.protocol import Action, ActionResult, DeviceSpec
from mainspring.protocol.tensors import TensorSpec
from mainspring.time import WallClock
from mainspring.transport.messages import ModelInfo
from mainspring.worker.runtimes.emulated import EmulatedDevice, NoiseModel

Sample = Mapping[str, np.ndarray[Any, Any]]
ResultCallback = Callable[[ActionResult], None]


class Worker(Protocol):
    """What the controller side needs from a worker, local or behind a socket."""

    @property
    def devices(self) -> Sequence[DeviceSpec]: ...

    load_errors: dict[str, str]  # models that could not be served, with the reason

    def profiles(self) -> Mapping[str, ModelProfile]:
        """Every served model's profile on this worker's device kind."""
        ...

    def configs(self) -> Mapping[str, ModelConfig]: ...

    def version_of(self, model: str) -> int:
        """The repository version served under ``model``."""
        ...

    def register(self, model: str) -> ModelProfile:
        """Start serving a repository model; ``ModelLoadError`` with the reason if it cannot."""
        ...

    def unregister(self, model: str) -> None: ...

    def resident_models(self, device: int) -> frozenset[str]:
        """Models whose weights ``device`` (this worker's id) holds now."""
        ...

    def submit(self, action: Action, inputs: Sequence[Sample] | None = None) -> None: ...

    def close(self) -> None: ...


def model_info(worker: Worker, model: str) -> ModelInfo:
    """What a worker announces about one of its models."""
    return ModelInfo(worker.configs()[model], worker.profiles()[model].to_json(), worker.version_of(model))


class ThreadTimer:
    """A real-time ``Timer``: callbacks run in order on one thread at (or just after) their time."""

    def __init__(self, name: str = "timer") -> None:
        self._clock = WallClock()
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._wakeup = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def now_ns(self) -> int:
        return self._clock.now_ns()

    def call_at(self, time_ns: int, callback: Callable[[], None]) -> None:
        with self._wakeup:
            heapq.heappush(self._queue, (time_ns, next(self._seq), callback))
            self._wakeup.notify()

    def close(self) -> None:
        with self._wakeup:
            self._closed = True
            self._wakeup.notify()
        self._thread.join(5.0)

    def _loop(self) -> None:
        while True:
            with self._wakeup:
                while not self._closed and (not self._queue or self._queue[0][0] > self.now_ns()):
                    timeout = (self._queue[0][0] - self.now_ns()) / 1e9 if self._queue else None
                    self._wakeup.wait(timeout)
                if self._closed:
                    return
                _, _, callback = heapq.heappop(self._queue)
            callback()


def echo_config(model: str, batch_sizes: Sequence[int]) -> ModelConfig:
    """An emulated model's config: FP32 vectors of any length in (``input``), the same out (``output``)."""
    return ModelConfig(
        name=model,
        format="torch_export",
        file="(emulated)",
        inputs=(TensorSpec("input", "FP32", (-1, -1)),),
        outputs=(TensorSpec("output", "FP32", (-1, -1)),),
        batch_sizes=tuple(batch_sizes),
    )


class EmulatedWorker:
    """Emulated devices (profile-driven durations, no compute) in real time; each model echoes its input."""

    def __init__(
        self,
        specs: Sequence[DeviceSpec],
        profiles: Mapping[str, ModelProfile],
        on_result: ResultCallback,
        noise: NoiseModel | None = None,
        seed: int = 0,
    ) -> None:
        self._timer = ThreadTimer("emulated-worker")
        self._profiles = dict(profiles)
        self._specs = tuple(specs)
        self._on_result = on_result
        self._inputs: dict[int, Sequence[Sample]] = {}
        self._devices = {
            spec.device: EmulatedDevice(spec, self._profiles, self._timer, self._echo, noise, seed + spec.device)
            for spec in specs
        }
        self.load_errors: dict[str, str] = {}

    @property
    def devices(self) -> Sequence[DeviceSpec]:
        return self._specs

    def profiles(self) -> Mapping[str, ModelProfile]:
        return dict(self._profiles)

    def configs(self) -> Mapping[str, ModelConfig]:
        return {name: echo_config(name, p.batch_sizes) for name, p in self._profiles.items()}

    def version_of(self, model: str) -> int:
        return 1

    def register(self, model: str) -> ModelProfile:
        raise ModelLoadError(f"model {model!r}: an emulated worker serves a fixed set of models")

    def unregister(self, model: str) -> None:
        self._profiles.pop(model, None)

    def resident_models(self, device: int) -> frozenset[str]:
        return self._devices[device].resident_models

    def _echo(self, result: ActionResult) -> None:
        inputs = self._inputs.pop(result.action_id, None)
        if inputs is not None and result.outputs is not None:
            echoed: list[object] = [{"output": sample.get("input")} for sample in inputs]
            result = ActionResult(result.action_id, result.device, result.status, result.timing, result.message, echoed)
        self._on_result(result)

    def submit(self, action: Action, inputs: Sequence[Sample] | None = None) -> None:
        if inputs is not None:
            self._inputs[action.action_id] = inputs
        device = self._devices.get(action.device)
        if device is None:
            raise ValueError(
                f"action {action.action_id} names device {action.device}, not one of {list(self._devices)}"
            )
        # The emulated device is single-threaded: hand the action to the timer thread.
        self._timer.call_at(self._timer.now_ns(), lambda: device.submit(action))

    def close(self) -> None:
        self._timer.close()
