"""A ``Worker`` of emulated devices in real time: profile-driven durations, no compute; each model
echoes its input. The live system's tests and benchmarks serve with it where compute is beside the point."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from mainspring.models.errors import ModelLoadError
from mainspring.models.profile import ModelProfile
from mainspring.protocol import Action, ActionResult, DeviceSpec
from mainspring.protocol.devices import GpuMemory
from mainspring.protocol.models import ModelConfig
from mainspring.protocol.tensors import Sample, TensorSpec
from mainspring.worker.api import ResultCallback
from mainspring.worker.runtimes.emulated import EmulatedDevice, NoiseModel
from mainspring.worker.timer import ThreadTimer


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
        self._catalog = dict(profiles)  # what it can serve: its repository
        self._profiles = dict(profiles)  # what it serves, by the name actions use
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

    def load_ns_of(self, model: str) -> int:
        return 0  # profiles only: nothing is read or warmed up

    def gpu_memory(self) -> tuple[GpuMemory, ...]:
        return ()

    def register(self, model: str, version: int | None = None, served_as: str = "") -> ModelProfile:
        key = served_as or model
        if model not in self._catalog or version not in (None, 1):
            raise ModelLoadError(f"model {model!r}: an emulated worker serves a fixed set of models at version 1")
        if key in self._profiles:
            raise ModelLoadError(f"model {key!r} is already registered")
        profile = self._profiles[key] = self._catalog[model].renamed(key)
        return profile

    def unregister(self, model: str) -> None:
        self._profiles.pop(model, None)
        for device in self._devices.values():  # on the timer thread, as every action of the device
            self._timer.call_at(self._timer.now_ns(), functools.partial(device.drop, model))

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
