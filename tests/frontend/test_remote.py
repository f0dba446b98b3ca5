"""A frontend process's view of the controller (``RemoteController``) over a real ZeroMQ socket."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.asyncio

from mainspring.controller.service import ServiceError
from mainspring.frontend import remote
from mainspring.frontend.remote import RemoteController
from mainspring.transport.frontend_messages import Join, State, Submit, decode_frontend
from mainspring.transport.messages import encode


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
        with pytest.raises(ServiceError, match=r"did not answer within 0\.3 s") as error:
            await controller.infer("m", [{"input": np.ones((1, 4), np.float32)}], slo_ns=100_000_000)
        assert error.value.kind == "unavailable" and 0.25 < time.monotonic() - begin < 2.0
        assert isinstance(seen[-1], Submit) and seen[-1].inputs[0][0].shape == (1, 4)
        await controller.close()
        task.cancel()
        router.close(0)

    asyncio.run(test())
