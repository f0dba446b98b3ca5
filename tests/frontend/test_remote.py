"""A frontend process's view of the controller (``RemoteController``) over a real ZeroMQ socket."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.asyncio

from mainspring.frontend import remote
from mainspring.frontend.dataplane import DataPlane, Tensor
from mainspring.frontend.port import ServiceError
from mainspring.frontend.remote import RemoteController
from mainspring.models.profile import ModelProfile
from mainspring.protocol import Outcome
from mainspring.protocol.models import ModelInfo
from mainspring.telemetry.recorder import ActionRow
from mainspring.transport.frontend_messages import Answers, Ask, Join, Reply, State, Submit, decode_frontend
from mainspring.transport.messages import encode, metas_of
from mainspring.worker.emulated_worker import echo_config


def test_a_call_the_controller_never_answers_fails_after_its_deadline_and_a_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller that took the call and went silent: the client gets 'unavailable', not a hang."""
    monkeypatch.setattr(remote, "ANSWER_GRACE_S", 0.2)
    endpoint = f"ipc://{tmp_path}/frontends"

    async def test() -> None:
        router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        router.bind(endpoint)
        seen: list[object] = []

        async def silent_controller() -> None:
            while True:
                identity, *frames = await router.recv_multipart()
                message, _ = decode_frontend(frames)
                seen.append(message)
                if isinstance(message, Join):
                    state = State([], 1, True, {}, 100_000_000)
                    await router.send_multipart([identity, *encode(state)])

        task = asyncio.create_task(silent_controller())
        controller = RemoteController(endpoint, "frontend-test")
        await controller.start(timeout_s=5)
        assert controller.accepting and controller.device_count == 1 and controller.default_slo_ns == 100_000_000
        begin = time.monotonic()
        call = controller.infer("m", [{"input": np.ones((1, 4), np.float32)}], slo_ns=100_000_000)
        with pytest.raises(ServiceError, match=r"did not answer within 0\.3 s") as error:
            await asyncio.wait_for(call, 60)  # a hang fails here, with TimeoutError
        assert error.value.kind == "unavailable" and time.monotonic() - begin > 0.25  # after the deadline and grace
        assert isinstance(seen[-1], Submit) and seen[-1].inputs[0][0].shape == (1, 4)
        await controller.close()
        task.cancel()
        router.close(0)

    asyncio.run(test())


def test_a_frontend_whose_view_trails_asks_the_controller_before_refusing(tmp_path: Path) -> None:
    """The frontend's last state has no model and no device (a worker joined a moment ago): an infer
    is not refused from it; the frontend asks for the state, then the call is served."""
    endpoint = f"ipc://{tmp_path}/frontends"
    profile = ModelProfile("m", "cpu", 4096, 1_000, {1: 1_000})
    fresh = State([ModelInfo(echo_config("m", [1]), profile.to_json(), 1)], 1, True, {}, 100_000_000)

    async def test() -> None:
        router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        router.bind(endpoint)

        async def controller() -> None:
            while True:
                identity, *frames = await router.recv_multipart()
                message, samples = decode_frontend(frames)
                if isinstance(message, Join):
                    await router.send_multipart([identity, *encode(State([], 0, True, {}, 100_000_000))])
                elif isinstance(message, Ask) and message.what == "state":
                    await router.send_multipart([identity, *encode(fresh)])
                    await router.send_multipart([identity, *encode(Reply(message.call))])
                elif isinstance(message, Submit) and samples is not None:  # echo
                    answers = Answers(message.call, [Outcome.SERVED], [""], metas_of([{"output": samples[0]["input"]}]))
                    await router.send_multipart([identity, *encode(answers, [{"output": samples[0]["input"]}])])

        task = asyncio.create_task(controller())
        remote_controller = RemoteController(endpoint, "frontend-test")
        await remote_controller.start(timeout_s=5)
        plane = DataPlane(remote_controller)
        assert not plane.ready()
        values = np.arange(4, dtype=np.float32).reshape(1, 4)
        served, outputs = await plane.infer("m", None, [Tensor("input", "FP32", [1, 4], values)], None, {})
        assert served.version == 1 and plane.ready()
        np.testing.assert_array_equal(outputs[0].data, values)
        await remote_controller.close()
        task.cancel()
        router.close(0)

    asyncio.run(test())


def test_a_load_or_unload_returns_once_every_frontend_answers_from_the_new_state(tmp_path: Path) -> None:
    """Two frontends on a real hub: the one that did not take the call already answers accordingly
    when the caller hears the unload is done (the emulated worker cannot load a model back: a load
    announces the same way)."""
    from mainspring.controller.frontends import FrontendHub
    from mainspring.frontend.dataplane import InferenceError
    from tests.controller.test_service import with_service

    async def test(service: object, _: DataPlane, __: object) -> None:
        from mainspring.controller.service import ControllerService

        assert isinstance(service, ControllerService)
        hub = FrontendHub(service, f"ipc://{tmp_path}/frontends")
        await hub.start()
        taking, other = RemoteController(hub.endpoint, "frontend-1"), RemoteController(hub.endpoint, "frontend-2")
        for frontend in (taking, other):
            await frontend.start(timeout_s=5)
        try:
            assert "b" in other.models
            await DataPlane(taking).unload("b")
            with pytest.raises(InferenceError) as gone:
                DataPlane(other).model_metadata("b", None)
            assert gone.value.status == 404
            await service.drain(0.5)  # a drain as well: no frontend still calls itself ready after it
            assert not DataPlane(other).ready() and not DataPlane(taking).ready()
        finally:
            for frontend in (taking, other):
                await frontend.close()
            await hub.close()

    with_service(test)


def test_clients_a_frontend_process_drops_are_counted_in_the_controllers_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted where /metrics is answered (the controller), by frontend, transport and cause, told together."""
    from mainspring.controller.frontends import FrontendHub
    from tests.controller.test_service import with_service
    from tests.frontend.test_connections import disconnects
    from tests.waiting import until

    monkeypatch.setattr(remote, "DROPPED_EVERY_S", 0.05)

    async def test(service: object, _: DataPlane, __: object) -> None:
        from mainspring.controller.service import ControllerService

        assert isinstance(service, ControllerService)
        hub = FrontendHub(service, f"ipc://{tmp_path}/frontends")
        await hub.start()
        frontend = RemoteController(hub.endpoint, "frontend-1")
        await frontend.start(timeout_s=5)
        try:
            for cause in ("hung_up", "hung_up", "header_timeout"):
                DataPlane(frontend).dropped.record("http", cause)
            await until(lambda: disconnects(service) == {"hung_up": 2, "header_timeout": 1})
            exposition = (await service.exposition()).decode()
            expected = 'mainspring_client_disconnects_total{cause="hung_up",frontend="frontend-1",transport="http"} 2.0'
            assert expected in exposition
        finally:
            await frontend.close()
            await hub.close()

    with_service(test)


def test_a_frontend_process_imports_neither_the_controller_nor_the_policies() -> None:
    """What a frontend needs of the controller is in ``frontend/port.py``: its process stays small (cells too)."""
    import subprocess
    import sys

    code = ("import sys, mainspring.frontend.process, mainspring.frontend.http, mainspring.frontend.grpc; "
            "print(sorted(m for m in sys.modules if m.startswith(('mainspring.controller', "
            "'mainspring.scheduler'))))")  # fmt: skip
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_a_frontend_can_have_a_model_warmed_before_its_requests_come(tmp_path: Path) -> None:
    """What a cell that takes a model over is asked (``CellsPort``): the controller loads it on a device
    with no request for it, once; a call from a frontend that never joined is refused, not run."""
    from mainspring.controller.frontends import FrontendHub
    from tests.controller.test_service import with_service
    from tests.waiting import until

    async def test(service: object, _: DataPlane, __: object) -> None:
        from mainspring.controller.service import ControllerService

        assert isinstance(service, ControllerService)
        hub = FrontendHub(service, f"ipc://{tmp_path}/frontends")
        await hub.start()
        frontend = RemoteController(hub.endpoint, "frontend-1")
        await frontend.start(timeout_s=5)
        try:

            def loads_of_a() -> list[ActionRow]:
                view = service.timeline.view(service.clock.now_ns(), 0, service.device_ids)
                return [a for a in view["actions"] if a.kind == "load" and a.model == "a"]

            assert not loads_of_a()
            assert await frontend.warm("a") is True
            await until(lambda: any(a.status == "ok" for a in loads_of_a()))
            assert await frontend.warm("a") is False  # held already
            with pytest.raises(ServiceError, match="unknown model 'nope'"):
                await frontend.warm("nope")
            stranger = RemoteController(hub.endpoint, "stranger")
            stranger._open()  # a socket, but no Join
            with pytest.raises(ServiceError, match="restarted since the call was sent") as refused:
                await stranger.infer("a", [{"input": np.ones((1, 3), np.float32)}], slo_ns=500_000_000)
            assert refused.value.kind == "unavailable" and refused.value.never_ran  # a frontend may try elsewhere
            await stranger.close()
        finally:
            await frontend.close()
            await hub.close()

    with_service(test)
