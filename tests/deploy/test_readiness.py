"""What /v2/models/<m>/ready means for a model paged out to host memory (docs/deploy.md, "Readiness"):
ready, because it can be served; its next request pays a weight load, so one whose SLO is shorter than
that load is refused at once, while the same SLO on a model resident on a device is met."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from mainspring.controller.service import ControllerService
from mainspring.frontend.dataplane import DataPlane, InferenceError, Tensor
from mainspring.protocol import DeviceSpec, Outcome
from mainspring.worker.emulated_worker import EmulatedWorker
from mainspring.worker.inprocess import InProcessWorker
from mainspring.worker.runtimes.emulated import NoiseModel
from tests.fakes import PAGE, profile

LOAD_MS = 40.0  # a weight load from host memory onto the device; inference takes 1 ms
SHORT = {"slo_ms": 10}  # room for an inference, not for a load
LONG = {"slo_ms": 1000}


def test_a_model_paged_out_to_host_memory_is_ready_and_its_next_request_pays_a_load() -> None:
    async def scenario() -> None:
        service = ControllerService(default_slo_ms=1000)
        profiles = {m: profile(m, exec_ms={1: 1.0}, load_ms=LOAD_MS, pages=2) for m in ("a", "b")}
        device = DeviceSpec(0, "v100", pool_bytes=3 * PAGE)  # room for one model's weights, not two
        handle = InProcessWorker("emulated", lambda sink: EmulatedWorker([device], profiles, sink, NoiseModel.exact()),
                                 service.worker_events, asyncio.get_running_loop())  # fmt: skip
        handle.join()
        plane = DataPlane(service)
        worker = handle.worker
        assert isinstance(worker, EmulatedWorker)
        one = [Tensor("input", "FP32", [1, 3], np.ones((1, 3), np.float32))]
        try:
            # On the worker's host, on no device: ready, yet a request that leaves no time to load is refused.
            assert worker.resident_models(0) == frozenset() and plane.model_ready("a") and plane.model_ready("b")
            with pytest.raises(InferenceError, match="deadline cannot be met") as refused:
                await plane.infer("a", None, one, None, SHORT)
            assert refused.value.status == 503 and refused.value.outcome is Outcome.DEADLINE_AT_ARRIVAL
            await plane.infer("a", None, one, None, LONG)  # loaded, then run
            assert worker.resident_models(0) == {"a"}
            await plane.infer("b", None, one, None, LONG)  # b's load evicts a: a is paged out again
            assert worker.resident_models(0) == {"b"}
            assert plane.model_ready("a") and plane.model_ready("b")  # ready says nothing of where weights are
            await plane.infer("b", None, one, None, SHORT)  # resident: the short SLO is met
            with pytest.raises(InferenceError, match="deadline cannot be met"):
                await plane.infer("a", None, one, None, SHORT)  # paged out: the same SLO is not
            await plane.infer("a", None, one, None, LONG)
            assert worker.resident_models(0) == {"a"}
        finally:
            await service.drain(1.0)
            handle.close("test over")

    asyncio.run(scenario())
