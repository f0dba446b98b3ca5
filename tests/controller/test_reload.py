"""Reloading a served model in place, and a worker that joins later serving what the controller serves
(in-process emulated workers, real time)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from mainspring.controller.service import ControllerService
from mainspring.frontend.dataplane import DataPlane, InferenceError
from mainspring.frontend.port import ServiceError
from mainspring.protocol.models import ModelOperation, ModelTarget
from mainspring.worker.inprocess import InProcessWorker
from tests.controller.test_service import emulated, tensor, with_service
from tests.fakes import profile
from tests.waiting import until


class Asking:
    """What ``keep_asking``'s clients got so far: requests answered, and every failure's message."""

    def __init__(self) -> None:
        self.answered = 0
        self.failures: list[str] = []

    def more_than(self, count: int) -> Callable[[], bool]:
        """A condition: more than ``count`` answered, or a failure (nothing to wait for then)."""
        return lambda: self.answered > count or bool(self.failures)


async def keep_asking(plane: DataPlane, model: str, stop: asyncio.Event, asking: Asking, clients: int = 8) -> None:
    """``clients`` closed-loop clients of ``model`` until ``stop``, counted in ``asking``."""

    async def client(seed: int) -> None:
        while not stop.is_set():
            sent = tensor(np.full((1, 3), seed + asking.answered, np.float32))
            try:
                _, outputs = await plane.infer(model, None, [sent], None, {})
                np.testing.assert_array_equal(outputs[0].data, sent.data)  # its own answer
                asking.answered += 1
            except InferenceError as error:
                asking.failures.append(str(error))

    await asyncio.gather(*(client(i) for i in range(clients)))


def test_a_reload_in_place_answers_every_request_and_retires_the_old_load() -> None:
    async def test(service: ControllerService, plane: DataPlane, handle: InProcessWorker) -> None:
        stop, asking = asyncio.Event(), Asking()
        clients = asyncio.create_task(keep_asking(plane, "a", stop, asking))
        await until(asking.more_than(25))  # served by the first load
        await service.reload_model("a")
        assert service.models["a"].key == "a@2" and plane.model_ready("a")
        assert plane.model_config("a")["name"] == "a" and plane.model_config("a")["profile"]["model"] == "a"
        await until(asking.more_than(asking.answered + 25))  # served by the new load
        stop.set()
        await clients
        assert asking.failures == [] and asking.answered > 50
        assert sorted(handle.worker.profiles()) == ["a@2", "b"]  # the old load is gone from the worker
        assert service.metrics.stats("a").success_count == asking.answered  # one model to its users, across the reload
        exposition = await service.exposition()
        assert b'model="a@2"' not in exposition and b'model="a"' in exposition
        await service.reload_model("a")  # again: another internal name
        assert service.models["a"].key == "a@3" and sorted(handle.worker.profiles()) == ["a@3", "b"]
        changes = await service.exposition()
        assert b'mainspring_model_changes_total{change="reload",model="a",result="done"} 2.0' in changes
        _, outputs = await plane.infer("a", None, [tensor(np.ones((1, 3), np.float32))], None, {})
        np.testing.assert_array_equal(outputs[0].data, np.ones((1, 3), np.float32))

    with_service(test)


def test_a_worker_that_joins_later_serves_what_is_served_not_what_it_holds() -> None:
    async def test(service: ControllerService, plane: DataPlane, first: InProcessWorker) -> None:
        await plane.unload("b")
        await service.reload_model("a")
        second = emulated(service, name="later")  # registered a and b under their own names at start
        second.join()
        try:
            await until(lambda: service.device_count == 4)
            assert sorted(second.worker.profiles()) == ["a@2"]  # b stays unloaded, a is the reloaded load
            assert sorted(service.models) == ["a"]
            service.worker_events.on_lost(first)
            first.close("gone")
            stop, asking = asyncio.Event(), Asking()
            clients = asyncio.create_task(keep_asking(plane, "a", stop, asking))
            await until(asking.more_than(20))
            stop.set()
            await clients
            assert asking.failures == [] and asking.answered > 20  # served on the later worker's devices alone
        finally:
            second.close("test over")

    with_service(test)


def test_a_restarted_controller_serves_a_reloaded_model_under_the_name_its_worker_holds() -> None:
    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        assert sorted(service.models) == ["a"] and service.models["a"].key == "a@2"
        assert service.models["a"].config.name == "a"  # what clients read
        assert plane.model_config("a")["profile"]["model"] == "a"
        _, outputs = await plane.infer("a", None, [tensor(np.ones((1, 3), np.float32))], None, {})
        np.testing.assert_array_equal(outputs[0].data, np.ones((1, 3), np.float32))
        with pytest.raises(InferenceError, match="unknown model: 'a@2'"):
            await plane.infer("a@2", None, [tensor(np.ones((1, 3), np.float32))], None, {})

    # the worker reloaded a before the controller restarted
    with_service(test, models=("a@2",), devices=1)


def test_changes_of_one_model_at_once_take_turns() -> None:
    async def test(service: ControllerService, plane: DataPlane, handle: InProcessWorker) -> None:
        await asyncio.gather(service.reload_model("a"), service.reload_model("a"))  # was: one refused
        assert service.models["a"].key == "a@3" and sorted(handle.worker.profiles()) == ["a@3", "b"]
        one = tensor(np.ones((1, 3), np.float32))
        admitted = [asyncio.create_task(plane.infer("a", None, [one], None, {})) for _ in range(20)]
        await asyncio.sleep(0)
        unloading = asyncio.create_task(plane.unload("a"))
        await asyncio.sleep(0)  # draining what was admitted
        await plane.load("a")  # waits for the unload, then loads it again (was: returned, and "a" went)
        await unloading
        await asyncio.gather(*admitted)
        assert plane.model_ready("a") and sorted(handle.worker.profiles()) == ["a", "b"]

    with_service(test)


def test_an_answer_names_a_reloaded_model_as_its_users_do() -> None:
    async def test(service: ControllerService, plane: DataPlane, _: InProcessWorker) -> None:
        await service.reload_model("big")
        with pytest.raises(InferenceError) as refused:
            await plane.infer("big", None, [tensor(np.ones((1, 3), np.float32))], None, {})
        assert "model 'big' does not fit on any device" in str(refused.value)  # was: 'big@2'

    with_service(test, devices=1, profiles={"big": profile("big", pages=10_000)})  # more pages than the pool


class DeafToLoads(InProcessWorker):
    """A worker that never answers a load: as one whose model file hangs its reader."""

    def model_op(self, op_id: int, op: ModelOperation, target: ModelTarget) -> None:
        if op is not ModelOperation.LOAD:
            super().model_op(op_id, op, target)


def test_a_reload_a_worker_does_not_answer_leaves_no_load_behind() -> None:
    async def test(service: ControllerService, plane: DataPlane, first: InProcessWorker) -> None:
        deaf = emulated(service, devices=1, name="deaf", kind=DeafToLoads)
        deaf.join()
        try:
            with pytest.raises(ServiceError, match="did not answer in"):
                await service.reload_model("a", timeout_s=0.3)
            assert service.models["a"].key == "a"  # still served as it was
            # The unload that cleans up is answered on the worker's thread (was: it kept a@2, which nothing unloads).
            await until(lambda: sorted(first.worker.profiles()) == ["a", "b"])
            _, outputs = await plane.infer("a", None, [tensor(np.ones((1, 3), np.float32))], None, {})
            np.testing.assert_array_equal(outputs[0].data, np.ones((1, 3), np.float32))
        finally:
            deaf.close("test over")

    with_service(test)
