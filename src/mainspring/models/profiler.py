"""Measure a model's load and exec times through the real worker path, as ``ModelProfile``s.

Every measurement is an action submitted to a ``TorchWorker`` and timed by it, so a
profile holds exactly what the worker will later report. Exec times: warm-up, then runs
until the p99 is stable (the p99 of all runs within ``tolerance`` of the p99 of the first
half) or the run or time budget is spent; the profile stores the p99.
"""

from __future__ import annotations

import itertools
import queue
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mainspring.models.profile import ModelProfile
from mainspring.models.zoo import example_inputs
from mainspring.protocol import Action, ActionResult, EvictWeights, Infer, LoadWeights
from mainspring.protocol.models import ModelConfig
from mainspring.protocol.tensors import Sample
from mainspring.time import NS_PER_S, WallClock


@dataclass(frozen=True)
class ProfilerSettings:
    warmup_runs: int = 5
    min_runs: int = 40
    max_runs: int = 400
    max_seconds_per_batch: float = 5.0
    load_runs: int = 10
    tolerance: float = 0.05

    def __post_init__(self) -> None:
        if self.max_runs < 1 or self.load_runs < 1:
            raise ValueError(f"max_runs={self.max_runs} and load_runs={self.load_runs} must be at least 1")
        if not self.max_seconds_per_batch > 0:
            raise ValueError(f"max_seconds_per_batch={self.max_seconds_per_batch} must be positive")


@dataclass(frozen=True)
class BatchMeasurement:
    batch: int
    durations_ns: tuple[int, ...]

    @property
    def p50_ns(self) -> int:
        return round(float(np.percentile(self.durations_ns, 50)))

    @property
    def p99_ns(self) -> int:
        return round(float(np.percentile(self.durations_ns, 99)))


class ActionRunner:
    """Runs one action at a time on a worker and waits for its result."""

    def __init__(self) -> None:
        self.results: queue.Queue[ActionResult] = queue.Queue()
        self._ids = itertools.count(1)
        self._clock = WallClock()

    def run(
        self,
        submit: Callable[[Action, list[Sample] | None], None],
        kind: type[LoadWeights | EvictWeights | Infer],
        model: str,
        batch: int = 0,
        samples: list[Sample] | None = None,
    ) -> ActionResult:
        now, action_id = self._clock.now_ns(), next(self._ids)
        latest = now + NS_PER_S
        action: Action
        if kind is Infer:
            ids = tuple(range(len(samples or ())))
            action = Infer(action_id, 0, model, now, latest, 0, request_ids=ids, batch_size=batch)
        elif kind is LoadWeights:
            action = LoadWeights(action_id, 0, model, now, latest, 0)
        else:
            action = EvictWeights(action_id, 0, model, now, latest, 0)
        submit(action, samples)
        result = self.results.get(timeout=60)
        if not result.ok or result.timing is None:
            raise RuntimeError(
                f"profiling {model}: {type(action).__name__} failed: {result.status.value} {result.message}"
            )
        return result


def sample_inputs(config: ModelConfig, batch: int, seed: int = 0) -> list[Sample]:
    """``batch`` requests of random inputs shaped as the config says."""
    tensors = example_inputs(config.inputs, batch, seed)
    return [
        {spec.name: t[i : i + 1].numpy() for spec, t in zip(config.inputs, tensors, strict=True)} for i in range(batch)
    ]


def measure_exec(
    runner: ActionRunner,
    submit: Callable[[Action, list[Sample] | None], None],
    config: ModelConfig,
    batch: int,
    settings: ProfilerSettings,
) -> BatchMeasurement:
    samples = sample_inputs(config, batch)
    for _ in range(settings.warmup_runs):
        runner.run(submit, Infer, config.name, batch, samples)
    durations: list[int] = []
    deadline = WallClock().now_ns() + round(settings.max_seconds_per_batch * NS_PER_S)
    while len(durations) < settings.max_runs:
        timing = runner.run(submit, Infer, config.name, batch, samples).timing
        assert timing is not None
        durations.append(timing.duration_ns)
        if len(durations) >= settings.min_runs and (
            _stable(durations, settings.tolerance) or WallClock().now_ns() > deadline
        ):
            break
    return BatchMeasurement(batch, tuple(durations))


def _stable(durations: list[int], tolerance: float) -> bool:
    whole = float(np.percentile(durations, 99))
    first_half = float(np.percentile(durations[: len(durations) // 2], 99))
    return abs(whole - first_half) <= tolerance * whole


def measure_load(
    runner: ActionRunner, submit: Callable[[Action, list[Sample] | None], None], model: str, runs: int
) -> list[int]:
    durations = []
    for _ in range(runs):
        timing = runner.run(submit, LoadWeights, model).timing
        assert timing is not None
        durations.append(timing.duration_ns)
        runner.run(submit, EvictWeights, model)
    return durations


def profile_from(provisional: ModelProfile, load_ns: list[int], batches: list[BatchMeasurement]) -> ModelProfile:
    """The measured profile: p99 of the loads and of each batch size."""
    return ModelProfile(
        model=provisional.model,
        device_kind=provisional.device_kind,
        weights_bytes=provisional.weights_bytes,
        load_ns=round(float(np.percentile(load_ns, 99))),
        exec_ns={m.batch: m.p99_ns for m in batches},
        tensor_bytes=provisional.tensor_bytes,
    )
