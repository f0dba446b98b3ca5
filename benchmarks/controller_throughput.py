"""Requests per second one controller process sustains with an instant model.

The live ``ControllerService`` (Clockwork policy) with emulated devices whose model takes
1 microsecond and echoes its input, in the same process. Two ways in, each measured for
``--seconds``: calling the service directly from ``--concurrency`` closed-loop tasks (the
controller alone), and KServe v2 HTTP from a client in another process (frontend plus
controller; the client has the other core). With ``--frontends 1,2``, also KServe v2 HTTP through
that many frontend processes of their own (``serve --frontends``: they decode, the controller
process schedules, over ZeroMQ), CPU per request of the controller and of the frontends apart.
Prints requests/s and CPU time per request.

    .venv/bin/python benchmarks/controller_throughput.py [--seconds 10] [--devices 2] [--models 100]
        [--loops asyncio,uvloop --rounds 2]   # event loops side by side, alternating (uvloop if installed)
        [--frontends 1,2]                      # HTTP through frontend processes of their own
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np
from aiohttp import web

from mainspring.controller.frontends import FrontendHub
from mainspring.controller.service import ControllerService
from mainspring.frontend.dataplane import DataPlane
from mainspring.frontend.http import make_app
from mainspring.frontend.process import FrontendSpec
from mainspring.models.profile import ModelProfile
from mainspring.protocol import DeviceSpec, ResponseStatus
from mainspring.worker.emulated_worker import EmulatedWorker
from mainspring.worker.inprocess import InProcessWorker
from mainspring.worker.runtimes.emulated import NoiseModel

BODY = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def start_service(devices: int, models: int) -> ControllerService:
    service = ControllerService(default_slo_ms=1000)
    profiles = {f"echo-{i}": ModelProfile(f"echo-{i}", "instant", 4096, 1_000, {1: 1_000, 2: 1_000, 4: 1_000, 8: 1_000})
                for i in range(models)}  # fmt: skip
    specs = [DeviceSpec(d, "instant") for d in range(devices)]
    loop = asyncio.get_running_loop()
    handle = InProcessWorker(
        "emulated", lambda sink: EmulatedWorker(specs, profiles, sink, NoiseModel.exact()), service.worker_events, loop
    )
    handle.join()
    return service


async def direct(service: ControllerService, seconds: float, concurrency: int, models: int) -> int:
    sample = {"input": np.ones((1, 4), np.float32)}
    done = 0
    stop = time.monotonic() + seconds

    async def client(index: int) -> None:
        nonlocal done
        model = f"echo-{index % models}"
        while time.monotonic() < stop:
            ((response, _),) = await service.infer(model, [sample], service.default_slo_ns)
            if response.status is not ResponseStatus.SUCCESS:
                raise RuntimeError(f"{response.status.value}: {response.reason}")
            done += 1

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return done


async def client_main(url_base: str, seconds: float, concurrency: int, models: int) -> None:
    import aiohttp

    done = 0
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:

        async def client(index: int) -> None:
            nonlocal done
            url = f"{url_base}/v2/models/echo-{index % models}/infer"
            while time.monotonic() < stop:
                async with session.post(url, data=BODY) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(await response.text())
                done += 1

        await asyncio.gather(*(client(i) for i in range(concurrency)))
    print(done)


async def over_http(service: ControllerService, seconds: float, concurrency: int, models: int) -> int:
    runner = web.AppRunner(make_app(DataPlane(service)), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    done = await run_client(port, seconds, concurrency, models)
    await runner.cleanup()
    return done


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of another process (Linux: from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_client(port: int, seconds: float, concurrency: int, models: int) -> int:
    command = [sys.executable, __file__, "--client", f"http://127.0.0.1:{port}", "--seconds", str(seconds),
               "--concurrency", str(concurrency), "--models", str(models)]  # fmt: skip
    process = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE)
    output, _ = await process.communicate()
    return int(output.decode().split()[-1])


async def through_frontends(
    service: ControllerService, count: int, seconds: float, concurrency: int, models: int
) -> tuple[int, float]:
    """Requests answered through ``count`` frontend processes, and those processes' CPU seconds."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="mainspring-") as folder:
        hub = FrontendHub(service, f"ipc://{folder}/frontends")
        await hub.start()
        frontends = []
        for index in range(count):
            spec = FrontendSpec(hub.endpoint, f"frontend-{index + 1}", "127.0.0.1", port, free_port(), os.getpid())
            frontends.append(subprocess.Popen([sys.executable, "-m", "mainspring.frontend.process",
                                               msgspec.json.encode(spec).decode()]))  # fmt: skip
        while hub.joined < count:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # listening
        before = sum(process_cpu_s(f.pid) for f in frontends)
        done = await run_client(port, seconds, concurrency, models)
        cpu = sum(process_cpu_s(f.pid) for f in frontends) - before
        for frontend in frontends:
            frontend.terminate()
            frontend.wait()
        await hub.close()
    return done, cpu


async def measure(args: argparse.Namespace, loop_name: str) -> None:
    service = await start_service(args.devices, args.models)
    for name, run in (("direct (controller only)", direct), ("KServe v2 HTTP (frontend + controller)", over_http)):
        before, begin = cpu_s(), time.monotonic()
        done = await run(service, args.seconds, args.concurrency, args.models)
        wall, cpu = time.monotonic() - begin, cpu_s() - before
        print(f"{loop_name:<8} {name:<40} {done / wall:>8.0f} r/s  {cpu / done * 1e6:>6.0f} us CPU/request "
              f"(server process, {cpu / wall:.2f} cores)", flush=True)  # fmt: skip
    for count in [int(n) for n in args.frontends.split(",") if n]:
        before, begin = cpu_s(), time.monotonic()
        done, frontend_cpu = await through_frontends(service, count, args.seconds, args.concurrency, args.models)
        wall, cpu = time.monotonic() - begin, cpu_s() - before
        name = f"HTTP via {count} frontend process(es)"
        print(f"{loop_name:<8} {name:<40} {done / wall:>8.0f} r/s  {cpu / done * 1e6:>6.0f} us CPU/request in the "
              f"controller, {frontend_cpu / done * 1e6:.0f} in the frontends "
              f"({cpu / wall:.2f} + {frontend_cpu / wall:.2f} cores)", flush=True)  # fmt: skip
    assert service.controller.outstanding == 0


def run_with_loop(args: argparse.Namespace, loop_name: str) -> None:
    if loop_name == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    else:
        asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    asyncio.run(measure(args, loop_name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--loops", default="asyncio", help="event loops to compare, comma-separated (uvloop)")
    parser.add_argument("--rounds", type=int, default=1, help="times through the loops, alternating")
    parser.add_argument("--frontends", default="", help="also HTTP through this many frontend processes, e.g. 1,2")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(client_main(args.client, args.seconds, args.concurrency, args.models))
        return
    print(f"instant model, {args.devices} emulated devices, {args.models} models, clockwork policy")
    for _ in range(args.rounds):
        for loop_name in args.loops.split(","):
            run_with_loop(args, loop_name)


if __name__ == "__main__":
    main()
