"""Triton's metric names as a user reads them off ``/metrics`` of a live service (an in-process emulated worker,
exact durations): pending requests while they wait, load times once a model loads, counts, durations and
failure reasons."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from mainspring.controller.service import ControllerService
from mainspring.frontend.cells_metrics import merge_expositions
from mainspring.frontend.dataplane import DataPlane, InferenceError, Tensor
from mainspring.worker.inprocess import InProcessWorker
from tests.controller.test_service import tensor, with_service
from tests.fakes import profile
from tests.telemetry.exposition import Labels
from tests.telemetry.exposition import samples as exposed
from tests.waiting import until

SLOW = {"slow": profile("slow", exec_ms={1: 40.0}, load_ms=2)}  # one request at a time, 40 ms each


async def samples(service: ControllerService, name: str) -> dict[Labels, float]:
    """The samples named ``name`` on ``/metrics``, by their labels (sorted)."""
    return exposed((await service.exposition()).decode()).get(name, {})


async def value(service: ControllerService, name: str, **labels: str) -> float | None:
    """The sample's value; None when it is not exposed."""
    return (await samples(service, name)).get(tuple(sorted(labels.items())))


async def pending(service: ControllerService) -> float:
    return await value(service, "nv_inference_pending_request_count", model="slow", version="1") or 0.0


def one(values: np.ndarray) -> list[Tensor]:
    return [tensor(values)]


def test_pending_requests_rise_while_they_wait_and_fall_to_zero_once_answered() -> None:
    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        patient = {"slo_ms": 30_000}  # none is refused for lack of time, however slow the machine
        calls = [asyncio.create_task(plane.infer("slow", None, one(np.ones((1, 3), np.float32)), None, patient))
                 for _ in range(12)]  # fmt: skip
        # 12 requests, one device running one at a time for 40 ms: most wait for a worker, and fewer as it works
        await until(lambda: pending(service))
        seen = [await pending(service)]
        while not all(call.done() for call in calls):
            seen.append(await pending(service))
            await asyncio.sleep(0.01)
        await asyncio.gather(*calls)
        assert max(seen) >= 6 and seen == sorted(seen, reverse=True), seen  # it drains
        assert await value(service, "nv_inference_pending_request_count", model="slow", version="1") == 0
        assert await value(service, "nv_inference_request_success", model="slow", version="1") == 12

    with_service(test, devices=1, profiles=SLOW)


def test_a_model_loaded_through_the_repository_api_shows_its_load_time_until_it_is_unloaded() -> None:
    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        assert await samples(service, "nv_model_load_duration_secs") == {}  # loaded before its worker joined
        await service.unload_model("a")
        await service.load_model("a")
        loads = await samples(service, "nv_model_load_duration_secs")
        assert list(loads) == [(("model", "a"), ("version", "1"))] and loads[(("model", "a"), ("version", "1"))] > 0
        await service.unload_model("a")
        assert await samples(service, "nv_model_load_duration_secs") == {}  # gone with the model, as in Triton

    with_service(test)


def test_counts_and_durations_follow_the_batches_that_ran() -> None:
    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        await plane.infer("a", None, one(np.ones((4, 3), np.float32)), None, {})  # 4 requests, one batch of 4

        async def counter(name: str) -> float | None:
            return await value(service, name + "", model="a", version="1")

        assert await counter("nv_inference_request_success") == 4
        assert await counter("nv_inference_count") == 4 and await counter("nv_inference_exec_count") == 1
        assert await counter("nv_inference_compute_infer_duration_us") == 4 * 2000  # each counts its batch's 2 ms
        request_us, queue_us = (
            await counter("nv_inference_request_duration_us"),
            await counter("nv_inference_queue_duration_us"),
        )
        assert request_us is not None and queue_us is not None and request_us >= queue_us + 4 * 2000
        quantiles = await samples(service, "nv_inference_compute_infer_summary_us")
        assert quantiles[(("model", "a"), ("quantile", "0.5"), ("version", "1"))] == 2000
        assert await value(service, "nv_inference_compute_infer_summary_us_sum", model="a", version="1") == 8000
        assert await value(service, "nv_inference_compute_infer_summary_us_count", model="a", version="1") == 4
        assert await value(service, "nv_inference_request_success", model="b", version="1") == 0  # served

    with_service(test, profiles={m: profile(m, exec_ms={1: 1.0, 2: 1.5, 4: 2.0}, load_ms=2) for m in ("a", "b")})


def test_requests_that_cannot_meet_their_deadline_count_as_rejected_failures() -> None:
    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        with contextlib.suppress(InferenceError):  # refused: 40 ms of work cannot finish within 1 ms
            await plane.infer("slow", None, one(np.ones((1, 3), np.float32)), None, {"slo_ms": 1})
        failures = await samples(service, "nv_inference_request_failure")
        by_reason = {dict(labels)["reason"]: count for labels, count in failures.items()}
        assert by_reason == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}

    with_service(test, devices=1, profiles=SLOW)


def test_with_cells_each_cells_samples_come_apart_by_a_cell_label() -> None:
    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        await plane.infer("a", None, one(np.ones((3, 3), np.float32)), None, {})
        text = await service.exposition()
        merged = exposed(merge_expositions([(0, text), (1, text)]).decode())  # two cells, as CellsPort merges them
        success = merged["nv_inference_request_success"]
        assert success == {(("cell", str(c)), ("model", m), ("version", "1")): 3 if m == "a" else 0
                           for c in (0, 1) for m in ("a", "b")}  # fmt: skip
        assert len(merged["nv_cpu_utilization"]) == 2  # each cell's host

    with_service(test)
