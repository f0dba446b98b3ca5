"""The live controller service and data plane with an in-process emulated worker (echo models, real time)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from mainspring.controller.service import ControllerService
from mainspring.frontend.dataplane import DataPlane, InferenceError, Tensor
from mainspring.models.profile import ModelProfile
from mainspring.protocol import DeviceSpec, Outcome
from mainspring.worker.emulated_worker import EmulatedWorker
from mainspring.worker.inprocess import InProcessWorker
from mainspring.worker.runtimes.emulated import NoiseModel
from tests.fakes import profile
from tests.waiting import until


def emulated(
    service: ControllerService,
    models: Sequence[str] = ("a", "b"),
    devices: int = 2,
    name: str = "emulated",
    profiles: Mapping[str, ModelProfile] | None = None,
    kind: type[InProcessWorker] = InProcessWorker,
) -> InProcessWorker:
    """A worker (call on the loop; not joined) of ``devices`` exact emulated devices serving ``models``
    at fast small profiles, or ``profiles``."""
    served = profiles or {m: profile(m, exec_ms={1: 1.0, 2: 1.5, 4: 2.0}, load_ms=2) for m in models}
    specs = [DeviceSpec(i, "v100") for i in range(devices)]
    return kind(name, lambda sink: EmulatedWorker(specs, served, sink, NoiseModel.exact()), service.worker_events,
                asyncio.get_running_loop())  # fmt: skip


def with_service(
    test: Callable[[ControllerService, DataPlane, InProcessWorker], Awaitable[None]],
    models: Sequence[str] = ("a", "b"),
    devices: int = 2,
    profiles: Mapping[str, ModelProfile] | None = None,
    **options: Any,
) -> None:
    """``test`` on a fresh service (``options``) with one joined ``emulated`` worker."""

    async def scenario() -> None:
        service = ControllerService(default_slo_ms=500, **options)
        handle = emulated(service, models, devices, profiles=profiles)
        handle.join()
        try:
            await test(service, DataPlane(service), handle)
        finally:
            await service.drain(1.0)
            handle.close("test over")  # also when the test declared it lost

    asyncio.run(scenario())


def tensor(values: np.ndarray) -> Tensor:
    return Tensor("input", "FP32", list(values.shape), values)


def test_a_request_of_n_samples_is_n_requests_answered_together() -> None:
    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        assert plane.ready() and service.device_count == 2 and sorted(service.models) == ["a", "b"]
        values = np.arange(15, dtype=np.float32).reshape(5, 3)
        served, outputs = await plane.infer("a", None, [tensor(values)], None, {})
        assert served.version == 1 and outputs[0].name == "output"
        np.testing.assert_array_equal(outputs[0].data, values)  # the echo model, samples back in order
        stats = (await plane.model_stats("a"))["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 5 and stats["execution_count"] >= 2

    with_service(test)


def test_the_samples_of_one_request_are_planned_together_as_one_batch() -> None:
    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        await plane.infer("a", None, [tensor(np.ones((1, 3), np.float32))], None, {})  # loaded, lanes idle again
        before = (await plane.model_stats("a"))["model_stats"][0]["execution_count"]
        values = np.arange(12, dtype=np.float32).reshape(4, 3)
        _, outputs = await plane.infer("a", None, [tensor(values)], None, {})
        np.testing.assert_array_equal(outputs[0].data, values)
        # one pass after all four are queued: one batch of 4, not a batch of 1 for the first sample
        # while the other three are still arriving
        assert (await plane.model_stats("a"))["model_stats"][0]["execution_count"] == before + 1

    with_service(test)


def test_clockwork_settings_reach_the_live_policy() -> None:
    """``serve --clockwork max_batch_size=1``: the four samples of one request run as four batches."""

    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        await plane.infer("a", None, [tensor(np.ones((1, 3), np.float32))], None, {})
        before = (await plane.model_stats("a"))["model_stats"][0]["execution_count"]
        await plane.infer("a", None, [tensor(np.ones((4, 3), np.float32))], None, {})
        assert (await plane.model_stats("a"))["model_stats"][0]["execution_count"] == before + 4

    with_service(test, policy_settings={"max_batch_size": 1})


def test_errors_of_the_data_plane() -> None:
    async def test(service: ControllerService, plane: DataPlane, handle: InProcessWorker) -> None:
        one = tensor(np.ones((1, 3), np.float32))
        with pytest.raises(InferenceError, match="unknown model: 'z'") as unknown:
            await plane.infer("z", None, [one], None, {})
        assert unknown.value.status == 404
        with pytest.raises(InferenceError, match="'a' version 2 is not found"):
            await plane.infer("a", "2", [one], None, {})
        with pytest.raises(InferenceError, match="deadline cannot be met") as rejected:
            await plane.infer("a", None, [one], None, {"slo_ms": 0.5})  # the fastest batch takes 1 ms
        assert rejected.value.status == 503
        with pytest.raises(InferenceError, match="fixed set") as refused:
            await plane.load("c")
        assert refused.value.status == 400
        await plane.unload("b")
        assert not plane.model_ready("b") and plane.model_ready("a")
        with pytest.raises(InferenceError) as gone:
            await plane.infer("b", None, [one], None, {})
        assert gone.value.status == 404
        service.worker_events.on_lost(handle)
        assert not plane.ready()
        with pytest.raises(InferenceError, match="no worker is connected") as no_worker:
            await plane.infer("a", None, [one], None, {})
        assert no_worker.value.status == 503

    with_service(test)


def test_a_worker_whose_action_never_reports_is_dropped_and_every_request_answered() -> None:
    async def scenario() -> None:
        service = ControllerService(default_slo_ms=500, watchdog_grace_s=0.2)
        profiles = {"a": profile("a", exec_ms={1: 1.0, 2: 1.5, 4: 2.0}, load_ms=2)}
        hung = NoiseModel(jitter_sigma=0.0, spike_probability=1.0, spike_min_factor=1e6, spike_max_factor=1e6)
        handle = InProcessWorker(  # every action takes a million times its profile: a lane that hangs
            "hung", lambda sink: EmulatedWorker([DeviceSpec(0, "v100")], profiles, sink, hung), service.worker_events,
            asyncio.get_running_loop(),
        )  # fmt: skip
        handle.join()
        plane = DataPlane(service)
        try:
            begin = asyncio.get_running_loop().time()
            with pytest.raises(InferenceError) as failed:
                await asyncio.wait_for(plane.infer("a", None, [tensor(np.ones((1, 3), np.float32))], None, {}), 10)
            assert failed.value.status == 503 and failed.value.outcome is not None  # answered, with a reason
            assert asyncio.get_running_loop().time() - begin < 5
            assert handle.closed and service.device_count == 0  # dropped: told to start over
        finally:
            await service.drain(1.0)
            handle.close("test over")

    asyncio.run(scenario())


def test_unloading_a_model_finishes_its_admitted_requests_first() -> None:
    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        one = tensor(np.ones((1, 3), np.float32))
        admitted = [asyncio.create_task(plane.infer("a", None, [one], None, {})) for _ in range(40)]
        await asyncio.sleep(0)  # every one submitted, none answered yet
        assert service.controller.outstanding == 40
        unloading = asyncio.create_task(plane.unload("a"))
        await asyncio.sleep(0)
        with pytest.raises(InferenceError, match="being unloaded") as refused:
            await plane.infer("a", None, [one], None, {})
        assert refused.value.status == 503
        for task in admitted:
            _, outputs = await task  # served, not answered "unloaded"
            np.testing.assert_array_equal(outputs[0].data, one.data)
        await unloading
        assert not plane.model_ready("a") and plane.model_ready("b")
        with pytest.raises(InferenceError, match="unknown model"):
            await plane.infer("a", None, [one], None, {})

    with_service(test)


@pytest.mark.parametrize(
    ("limits", "setting"),
    [({"max_outstanding": 9}, "max_outstanding"), ({"max_outstanding_bytes": 100}, "max_outstanding_bytes")],
)
def test_past_the_outstanding_limits_requests_are_refused_429_and_the_rest_served(
    limits: dict[str, int], setting: str
) -> None:
    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        one = tensor(np.ones((1, 3), np.float32))  # 12 bytes: 8 of them fit in 100
        admitted = [asyncio.create_task(plane.infer("a", None, [one], None, {})) for _ in range(8)]
        await asyncio.sleep(0)
        with pytest.raises(InferenceError, match=f"\\({setting}\\)") as refused:
            await plane.infer("b", None, [tensor(np.ones((2, 3), np.float32))], None, {})
        assert refused.value.status == 429 and refused.value.outcome is Outcome.OVERLOADED
        for task in admitted:
            _, outputs = await task
            assert outputs[0].data.shape == (1, 3)
        await plane.infer("b", None, [one], None, {})  # room again once they are answered

    with_service(test, **limits)


def test_a_controller_whose_loop_falls_behind_refuses_new_requests_429_until_it_catches_up() -> None:
    """A limit of 100 ms and blocks of twice that: the delays of a busy machine (tens of ms) neither turn one
    block into a refusal nor keep many from one."""

    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        def caught_up() -> bool:
            return service.load_limits.loop_lag_ns <= service.load_limits.max_loop_lag_ns

        one = tensor(np.ones((1, 3), np.float32))
        await plane.infer("a", None, [one], None, {})
        await until(caught_up)  # a busy machine may have delayed the loop already
        time.sleep(0.2)  # one long callback: not an overload
        await asyncio.sleep(0.02)
        await plane.infer("a", None, [one], None, {})
        await until(caught_up)
        for _ in range(6):  # the loop keeps falling behind (the controller's CPU is spent) ...
            time.sleep(0.2)
            await asyncio.sleep(0)  # ... and its timer wakes late again and again
        with pytest.raises(InferenceError, match=r"ms behind \(max_loop_lag_ms\)") as refused:
            await plane.infer("a", None, [one], None, {})
        assert refused.value.status == 429 and refused.value.outcome is Outcome.OVERLOADED
        await until(caught_up)  # the recorded lag halves every 100 ms
        _, outputs = await plane.infer("a", None, [one], None, {})
        assert outputs[0].data.shape == (1, 3)

    with_service(test, max_loop_lag_ms=100)
