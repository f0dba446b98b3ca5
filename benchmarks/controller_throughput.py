"""Requests per second one controller process sustains with an instant model.

The live ``ControllerService`` (Clockwork policy) with emulated devices whose model takes
1 microsecond and echoes its input, in the same process. Two ways in, each measured for
``--seconds``: calling the service directly from ``--concurrency`` closed-loop tasks (the
controller alone), and KServe v2 HTTP from a client in another process (frontend plus
controller; the client has the other core). Prints requests/s and the server process's
CPU time per request.

    .venv/bin/python benchmarks/controller_throughput.py [--seconds 10] [--devices 2] [--models 100]
        [--loops asyncio,uvloop --rounds 2]   # event loops side by side, alternating (uvloop if installed)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import subprocess
import sys
import time

import numpy as np
from aiohttp import web

from mainspring.controller.service import ControllerService
from mainspring.frontend.dataplane import DataPlane
from mainspring.frontend.http import make_app
from mainspring.models.profile import ModelProfile
from mainspring.protocol import DeviceSpec, ResponseStatus
from mainspring.transport.inprocess import InProcessWorker
from mainspring.worker.emulated_worker import EmulatedWorker
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
        "emulated", lambda sink: EmulatedWorker(specs, profiles, sink, NoiseModel.exact()), service, loop
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
            ((response, _),) = await service.infer(model, [sample])
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    command = [sys.executable, __file__, "--client", f"http://127.0.0.1:{port}", "--seconds", str(seconds),
               "--concurrency", str(concurrency), "--models", str(models)]  # fmt: skip
    process = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE)
    output, _ = await process.communicate()
    await runner.cleanup()
    return int(output.decode().split()[-1])


async def measure(args: argparse.Namespace, loop_name: str) -> None:
    service = await start_service(args.devices, args.models)
    for name, run in (("direct (controller only)", direct), ("KServe v2 HTTP (frontend + controller)", over_http)):
        before, begin = cpu_s(), time.monotonic()
        done = await run(service, args.seconds, args.concurrency, args.models)
        wall, cpu = time.monotonic() - begin, cpu_s() - before
        print(f"{loop_name:<8} {name:<40} {done / wall:>8.0f} r/s  {cpu / done * 1e6:>6.0f} us CPU/request "
              f"(server process, {cpu / wall:.2f} cores)", flush=True)  # fmt: skip
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
