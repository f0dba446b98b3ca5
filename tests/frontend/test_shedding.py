"""Shedding at arrival: a frontend whose event loop runs late refuses a share of new calls at once (429
``overloaded``, before they are parsed), takes all again once it catches up, and a call's time before the
controller saw it counts against its deadline."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mainspring.controller.service import ControllerService
from mainspring.frontend.dataplane import DataPlane, InferenceError
from mainspring.frontend.http import start_http
from mainspring.frontend.shedding import FLOOR, ArrivalGate, target_lag_ns
from mainspring.protocol import Outcome
from mainspring.time import NS_PER_MS
from tests.controller.test_service import emulated, tensor, with_service
from tests.serving.processes import free_port, http_call

TARGET = 10 * NS_PER_MS


def admitted(gate: ArrivalGate, calls: int) -> int:
    return sum(gate.admit() for _ in range(calls))


def test_a_gate_on_time_takes_every_call() -> None:
    gate = ArrivalGate(TARGET)
    for _ in range(50):
        gate.tick(TARGET)  # at the target is on time
    assert gate.share == 1.0 and admitted(gate, 1000) == 1000


def test_late_ticks_cut_the_share_taken_and_on_time_ticks_restore_it() -> None:
    gate = ArrivalGate(TARGET)
    gate.tick(TARGET + 1)
    assert gate.share == pytest.approx(0.7)
    assert admitted(gate, 1000) == pytest.approx(700, abs=1)  # spread evenly: no draw, the same every run
    for _ in range(100):
        gate.tick(5 * TARGET)
    assert gate.share == FLOOR and admitted(gate, 1000) == pytest.approx(1000 * FLOOR, abs=1)  # never none
    ticks = 0
    while gate.share < 1.0:
        gate.tick(0)
        ticks += 1
    assert ticks <= 20  # 100 ms of a loop on time: all calls again
    for _ in range(50):  # the controller refused many as overloaded: the next wake is late here too, once
        gate.overloaded_elsewhere()
    assert gate.share == 1.0
    gate.woke(0)
    assert gate.share == pytest.approx(0.7)  # one cut, not fifty
    gate.woke(0)
    assert gate.share == pytest.approx(0.75)  # this loop on time, and the controller said nothing more


def test_a_loop_far_behind_is_cut_in_proportion_and_one_late_wake_moves_nothing() -> None:
    """Its timer wakes less often the later the loop runs, so a fixed cut per wake would come ever more
    slowly while the backlog grows: a loop 20 times late keeps a twentieth at once. One late wake among
    on-time ones (a long callback, a pause) neither cuts nor restores; every wake late cuts."""
    gate = ArrivalGate(TARGET)
    gate.tick(20 * TARGET)
    assert gate.share == pytest.approx(1 / 20)
    gate = ArrivalGate(TARGET)
    gate.woke(0)
    gate.woke(10 * TARGET)  # one late wake
    assert gate.share == 1.0
    gate.woke(10 * TARGET)  # late again: behind, not paused
    assert gate.share == pytest.approx(0.1)
    gate.woke(0)  # on time once: not yet shown to keep up
    assert gate.share == pytest.approx(0.1)
    gate.woke(0)
    assert gate.share == pytest.approx(0.15)


def test_a_gate_turned_off_takes_every_call_whatever_it_hears() -> None:
    gate = ArrivalGate(TARGET, watching=False)
    gate.overloaded_elsewhere()
    assert admitted(gate, 100) == 100


def test_the_target_is_a_twentieth_of_the_slo_and_at_least_a_millisecond() -> None:
    assert target_lag_ns(100 * NS_PER_MS) == 5 * NS_PER_MS
    assert target_lag_ns(10 * NS_PER_MS) == NS_PER_MS


def test_time_a_call_waited_before_the_controller_saw_it_counts_against_its_deadline() -> None:
    async def test(service: ControllerService, plane: DataPlane, _: object) -> None:
        one = tensor(np.ones((1, 3), np.float32))
        with pytest.raises(InferenceError) as late:  # the SLO is 500 ms, all but 0.2 gone; a batch takes 1
            await plane.infer("a", None, [one], None, {}, arrival_ns=time.monotonic_ns() - 499_800_000)
        assert late.value.status == 503 and late.value.outcome is Outcome.DEADLINE_AT_ARRIVAL
        served, _ = await plane.infer("a", None, [one], None, {}, arrival_ns=time.monotonic_ns() - 10 * NS_PER_MS)
        assert served.config.name == "a"

    with_service(test)


def test_a_late_loop_refuses_new_calls_at_once_and_takes_them_again_once_it_catches_up() -> None:
    # The loop is held up by a callback that blocks for 100 ms every tick (as a CPU that cannot keep up
    # would hold it): far past the target of a 1 s SLO (50 ms). Calls come from a thread of their own.
    port = free_port()
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]})
    url = f"http://127.0.0.1:{port}/v2/models/a/infer"
    answers: list[tuple[str, int, bytes]] = []
    phase = {"now": "hogged"}

    def client(stop: threading.Event) -> None:
        while not stop.is_set():
            status, reply = http_call(url, body.encode())
            answers.append((phase["now"], status, reply))

    async def scenario() -> None:
        service = ControllerService(default_slo_ms=1000, max_loop_lag_ms=60_000)  # only the gate refuses
        handle = emulated(service)
        handle.join()
        plane = DataPlane(service)
        runner = await start_http(plane, "127.0.0.1", port)
        stop = threading.Event()
        thread = threading.Thread(target=client, args=(stop,), daemon=True)
        try:
            hog_until = time.monotonic() + 60.0  # until five calls were shed (a busy machine sends fewer)
            thread.start()
            while time.monotonic() < hog_until and sum(s == 429 for _, s, _ in answers) < 5:
                time.sleep(0.1)  # the loop's CPU spent elsewhere (twice the target lag of a 1 s SLO)
                await asyncio.sleep(0)
            phase["now"] = "caught up"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and [s for p, s, _ in answers[-20:] if p == "caught up"] != [200] * 20:
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.to_thread(thread.join, 60)
            await runner.cleanup()
            plane.gate.stop()
            await service.drain(1.0)
            handle.close("test over")

    asyncio.run(scenario())
    hogged = [(status, reply) for phase_now, status, reply in answers if phase_now == "hogged"]
    shed = [json.loads(reply) for status, reply in hogged if status == 429]
    assert len(shed) >= 5, hogged[:5]
    assert all(s["outcome"] == "overloaded" and "event loop runs" in s["error"] for s in shed), shed[:3]
    assert all(status in (200, 429) for status, _ in hogged)  # each answered once: served or refused
    recovered = [status for phase_now, status, _ in answers if phase_now == "caught up"]
    assert recovered[-20:] == [200] * 20, recovered[-30:]  # every call taken again, twenty in a row
    assert all(status in (200, 429) for status in recovered)


def test_a_controller_whose_loop_runs_late_refuses_calls_from_frontend_processes_before_admitting_them(
    tmp_path: Path,
) -> None:
    """The controller's end of the frontend channel (a cell, or ``--frontends`` processes) sheds at arrival
    as a frontend does: while its loop is held up, calls are refused ``overloaded`` before the policy sees
    them (none is admitted to expire in its queue); once it catches up, calls are served again."""
    from mainspring.controller.frontends import FrontendHub
    from mainspring.frontend.port import ServiceError
    from mainspring.frontend.remote import RemoteController

    outcomes: list[tuple[str, str]] = []

    async def call(remote: RemoteController, phase: str) -> None:
        sample = {"input": np.ones((1, 3), dtype=np.float32)}
        try:
            answers = await remote.infer("a", [sample], 1_000 * NS_PER_MS)
            outcomes.append((phase, answers[0][0].outcome.value))
        except ServiceError as error:
            outcomes.append((phase, f"{error.kind}: {error}"))

    async def scenario() -> None:
        service = ControllerService(default_slo_ms=1000, max_loop_lag_ms=60_000)  # only the gate refuses
        handle = emulated(service)
        handle.join()
        hub = FrontendHub(service, f"ipc://{tmp_path}/frontends")
        await hub.start()
        remote = RemoteController(hub.endpoint, "frontend-1")
        await remote.start(timeout_s=5)
        calls: list[asyncio.Task[None]] = []
        try:
            hog_until = time.monotonic() + 60.0
            while time.monotonic() < hog_until and sum("overloaded" in o for _, o in outcomes) < 5:
                calls.append(asyncio.create_task(call(remote, "hogged")))
                time.sleep(0.1)  # the loop's CPU spent elsewhere: twice the target lag of a 1 s SLO
                await asyncio.sleep(0)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and [o for p, o in outcomes[-10:] if p == "caught up"] != ["served"] * 10:
                await call(remote, "caught up")
                await asyncio.sleep(0.01)
            await asyncio.gather(*calls)
        finally:
            await remote.close()
            await hub.close()
            await service.drain(1.0)
            handle.close("test over")

    asyncio.run(scenario())
    hogged = [o for p, o in outcomes if p == "hogged"]
    shed = [o for o in hogged if o.startswith("overloaded")]
    assert len(shed) >= 5 and all("event loop runs" in o for o in shed), hogged[:5]
    assert all(o == "served" or o.startswith("overloaded") for o in hogged), hogged  # none expired in a queue
    assert [o for p, o in outcomes if p == "caught up"][-10:] == ["served"] * 10
