"""A worker that lies: a real ZeroMQ DEALER speaking the protocol to a real controller (``ControllerService``
behind a ``WorkerHub``). Every malformed result answers its requests once, with ``bad_result`` naming the
worker, within the action's deadline plus the watchdog's grace; the worker is dropped, rejoins only after a
backoff that grows, and the controller goes on serving."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import numpy as np
import pytest
import zmq
import zmq.asyncio

from mainspring.controller.rejoin import RejoinBackoff
from mainspring.controller.service import ControllerService
from mainspring.models.profile import ModelProfile
from mainspring.protocol import ActionResult, ActionStatus, DeviceSpec, Infer, Outcome, Request, Response, Timing
from mainspring.protocol.models import ModelConfig, ModelInfo
from mainspring.protocol.tensors import TensorSpec
from mainspring.time import NS_PER_MS, WallClock
from mainspring.transport.messages import Act, Hello, Ping, Pong, Result, decode, encode, metas_of
from mainspring.transport.zmq_hub import WorkerHub
from tests.waiting import until

GRACE_S = 1.0
SLO_MS = 1500.0
INPUTS, OUTPUTS = (TensorSpec("input", "FP32", (-1, 4)),), (TensorSpec("logits", "FP32", (-1, 3)),)
CONFIG = ModelConfig("mlp", "torch_export", "model.pt2", INPUTS, OUTPUTS)
PROFILE = ModelProfile("mlp", "cpu", 1024, NS_PER_MS, {1: NS_PER_MS, 2: NS_PER_MS, 4: NS_PER_MS, 8: NS_PER_MS})
INFO = ModelInfo(CONFIG, PROFILE.to_json())
EVIL = ModelInfo(msgspec.structs.replace(CONFIG, name="evil"), PROFILE.renamed("evil").to_json())

Reply = Callable[[Infer, list[dict[str, Any]]], list[bytes] | None]  # an Infer's answer frames (None: silence)


def good(batch: int) -> list[dict[str, Any]]:
    return [{"logits": np.zeros((1, 3), np.float32)} for _ in range(batch)]


def result(infer: Infer, outputs: list[dict[str, Any]]) -> list[bytes]:
    now = WallClock().now_ns()
    answer = ActionResult(infer.action_id, infer.device, ActionStatus.OK, Timing(now - 1000, now))
    return [bytes(f) for f in encode(Result(answer, metas_of(outputs)), outputs)]


MALFORMED: dict[str, Reply] = {
    "short": lambda infer, _: result(infer, good(len(infer.request_ids))[:-1]),
    "long": lambda infer, _: result(infer, good(len(infer.request_ids) + 1)),
    "wrong name": lambda infer, _: result(infer, [{"scores": np.zeros((1, 3), np.float32)}] * len(infer.request_ids)),
    "wrong dtype": lambda infer, _: result(infer, [{"logits": np.zeros((1, 3), np.float64)}] * len(infer.request_ids)),
    "wrong shape": lambda infer, _: result(infer, [{"logits": np.zeros((7, 3), np.float32)}] * len(infer.request_ids)),
    "garbage frames": lambda infer, _: [b"\xc1 not msgpack", b"junk"],
    "frames short of the header": lambda infer, _: result(infer, good(len(infer.request_ids)))[:-1],
    "silence": lambda infer, _: None,
}
CAUSE = {"garbage frames": "bad_message", "frames short of the header": "bad_message", "silence": "hung"}


class Rogue:
    """A DEALER that says hello as ``name`` announcing ``models``, answers pings, loads at once, and answers
    each Infer with ``reply``; ``received`` counts what reached it."""

    def __init__(self, endpoint: str, name: str, reply: Reply, models: list[ModelInfo] | None = None) -> None:
        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt_string(zmq.IDENTITY, name)
        self.socket.connect(endpoint)
        self.name, self.reply, self.models = name, reply, models or [INFO]
        self.received: Counter[str] = Counter()
        self._task = asyncio.create_task(self._run())

    async def hello(self) -> None:
        device = DeviceSpec(0, "cpu", 64 * 1024 * 1024, resident=tuple(m.config.name for m in self.models))
        await self.socket.send_multipart(encode(Hello(self.name, [device], self.models)))

    async def _run(self) -> None:
        while True:
            message, samples = decode(await self.socket.recv_multipart())
            self.received[type(message).__name__] += 1
            if isinstance(message, Ping):
                await self.socket.send_multipart(encode(Pong(message.controller_ns, WallClock().now_ns())))
            elif isinstance(message, Act) and isinstance(message.action, Infer):
                frames = self.reply(message.action, samples or [])
                if frames is not None:
                    await self.socket.send_multipart(frames)
            elif isinstance(message, Act):
                now = WallClock().now_ns()
                done = ActionResult(message.action.action_id, message.action.device, ActionStatus.OK, Timing(now, now))
                await self.socket.send_multipart(encode(Result(done)))

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.socket.close()
        self.context.term()


@contextlib.asynccontextmanager
async def controller() -> AsyncIterator[tuple[ControllerService, WorkerHub, Counter[int]]]:
    """A live controller on loopback; the counter tells how many times each request was answered."""
    service = ControllerService(default_slo_ms=SLO_MS, watchdog_grace_s=GRACE_S)
    answered: Counter[int] = Counter()
    answer = service._answer

    def count(request: Request, response: Response, output: object) -> None:
        answered[request.id] += 1
        answer(request, response, output)

    service.controller._answer = count
    hub = WorkerHub("tcp://127.0.0.1:0", service.worker_events, heartbeat_s=0.05, timeout_s=5.0)
    await hub.start()
    try:
        yield service, hub, answered
    finally:
        await service.drain(1.0)
        await hub.close()


async def joined(rogue: Rogue, service: ControllerService) -> None:
    await rogue.hello()
    await until(lambda: any(w.name == rogue.name for w in service.workers), 10)


def infer(service: ControllerService, count: int) -> Any:
    samples = [{"input": np.ones((1, 4), np.float32)} for _ in range(count)]
    return service.infer("mlp", samples, service.default_slo_ns)


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_result_answers_its_requests_once_in_time_and_drops_the_worker(case: str) -> None:
    async def scenario() -> None:
        async with controller() as (service, hub, answered):
            rogue = Rogue(hub.endpoint, f"rogue-{case.replace(' ', '-')}", MALFORMED[case])
            try:
                await joined(rogue, service)
                begin = time.monotonic()
                answers = await asyncio.wait_for(infer(service, 2), SLO_MS / 1000 + GRACE_S + 5)
                elapsed = time.monotonic() - begin
                outcomes = {response.outcome for response, _ in answers}
                assert Outcome.SERVED not in outcomes, answers
                if case in CAUSE:  # nothing to pin on a result: the worker's loss answers them, as the watchdog's
                    assert elapsed <= SLO_MS / 1000 + GRACE_S + 1.0 and not any(out for _, out in answers)
                else:
                    assert outcomes == {Outcome.BAD_RESULT}, answers
                    assert all(f"worker {rogue.name} sent a malformed result" in r.reason for r, _ in answers)
                await until(lambda: not service.workers, 10)  # dropped
                assert service.metrics.workers_dropped.labels(CAUSE.get(case, "bad_result"))._value.get() == 1
                # The controller still serves: an honest worker joins and answers.
                honest = Rogue(hub.endpoint, "honest", lambda infer, _: result(infer, good(len(infer.request_ids))))
                try:
                    await joined(honest, service)
                    answers = await asyncio.wait_for(infer(service, 3), 10)
                    assert {r.outcome for r, _ in answers} == {Outcome.SERVED}
                    assert all(out["logits"].shape == (1, 3) for _, out in answers)
                finally:
                    await honest.close()
            finally:
                await rogue.close()
            assert set(answered.values()) == {1} and len(answered) == 5

    asyncio.run(scenario())


def test_a_dropped_worker_rejoins_after_a_backoff_that_grows_and_is_counted() -> None:
    async def scenario() -> None:
        async with controller() as (service, hub, _):
            rogue = Rogue(hub.endpoint, "flaky", MALFORMED["short"])
            try:
                waited = []
                await joined(rogue, service)
                for drop in range(2):
                    await asyncio.wait_for(infer(service, 2), 10)
                    await until(lambda: not service.workers, 10)
                    assert service.metrics.rejoin_backoff._value.get() == 2.0**drop
                    dropped = time.monotonic()
                    while not service.workers:  # it says hello again and again, as a worker does
                        await rogue.hello()
                        await asyncio.sleep(0.1)
                    waited.append(time.monotonic() - dropped)
                assert 1.0 <= waited[0] < 2.0 <= waited[1], waited
                assert service.metrics.rejoins_deferred._value.get() >= 10  # ten hellos a second went unanswered
            finally:
                await rogue.close()

    asyncio.run(scenario())


def test_a_model_the_repository_lacks_is_never_served() -> None:
    async def scenario() -> None:
        async with controller() as (service, hub, _):
            service.worker_events.known_models = lambda: ["mlp"]
            rogue = Rogue(hub.endpoint, "announcer", MALFORMED["silence"], models=[INFO, EVIL])
            try:
                await joined(rogue, service)
                assert sorted(service.models) == ["mlp"]
            finally:
                await rogue.close()

    asyncio.run(scenario())


def test_the_backoff_doubles_to_its_cap_and_starts_over_after_a_quiet_period() -> None:
    now = [0.0]
    backoff = RejoinBackoff(first_s=1.0, longest_s=8.0, quiet_s=100.0, clock=lambda: now[0])
    delays = []
    for _ in range(6):
        delays.append(backoff.dropped("w"))
        now[0] += 10.0
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert backoff.wait_s("other") == (0.0, False)
    backoff.dropped("w")
    now[0] += 3.0
    assert backoff.wait_s("w") == (5.0, True) and backoff.wait_s("w") == (5.0, False)  # only the first is told
    now[0] += 200.0  # quiet: the next drop starts over
    assert backoff.wait_s("w") == (0.0, False) and backoff.dropped("w") == 1.0
