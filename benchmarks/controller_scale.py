"""Controller at scale, live (Clockwork's Fig. 11 in real time): how many devices one controller keeps busy.

One process holds the live ``ControllerService`` (Clockwork policy, its asyncio loop) and N
emulated V100s (Clockwork's published profiles, default noise) that run in real time on one
timer thread; 50 model copies per device. For each N, open-loop Poisson arrivals at
``--load`` times ``--rate-per-device`` x N are sent from the schedule (a late send is counted,
never skipped) for ``--seconds``, SLO 100 ms. Per N it prints offered and answered load, goodput,
attainment, the process's CPU (cores), and the event loop's lag (how late a 1 ms ticker wakes,
p99): the controller keeps up while attainment holds and the lag stays small; past that,
requests wait for the loop itself. Emulated lanes and load generation share the process (and
its GIL) with the controller, so the figures are a floor for a controller with a process and a
core of its own.

    .venv/bin/python benchmarks/controller_scale.py [--devices 2 5 10 20 40] [--load 0.5 1.0] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import time

import numpy as np

from mainspring.controller.service import ControllerService
from mainspring.frontend.port import ServiceError
from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.protocol import DeviceSpec, ResponseStatus
from mainspring.protocol.pages import DEFAULT_POOL_BYTES
from mainspring.worker.emulated_worker import EmulatedWorker
from mainspring.worker.inprocess import InProcessWorker

SLO_MS = 100.0


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def lag_ticker(stop: asyncio.Event, lags: list[float]) -> None:
    """How late a 1 ms sleep wakes: the time requests wait for the loop itself."""
    while not stop.is_set():
        begin = time.monotonic()
        await asyncio.sleep(0.001)
        lags.append(time.monotonic() - begin - 0.001)


async def run_point(devices: int, rate: float, seconds: float, seed: int, max_lag_ms: float) -> dict[str, float]:
    service = ControllerService(default_slo_ms=SLO_MS, max_loop_lag_ms=max_lag_ms)
    profiles = {p.model: p for p in model_copies(builtin_profiles(), 50 * devices)}
    specs = [DeviceSpec(d, "v100", DEFAULT_POOL_BYTES) for d in range(devices)]
    handle = InProcessWorker(
        "emulated",
        lambda sink: EmulatedWorker(specs, profiles, sink, seed=seed),
        service.worker_events,
        asyncio.get_running_loop(),
    )
    handle.join()
    names = sorted(profiles)
    rng = random.Random(seed)
    sample = {"input": np.ones((1, 4), np.float32)}
    counts = {"sent": 0, "good": 0, "answered": 0, "shed": 0, "late_sends": 0}
    stop, lags = asyncio.Event(), []
    ticker = asyncio.create_task(lag_ticker(stop, lags))

    async def one(model: str) -> None:
        begin = time.monotonic()
        try:
            ((response, _),) = await service.infer(model, [sample], service.default_slo_ns)
        except ServiceError:  # refused at the door (429): the loop is behind (max_loop_lag_ms)
            counts["shed"] += 1
            return
        counts["answered"] += 1
        if response.status is ResponseStatus.SUCCESS and time.monotonic() - begin <= SLO_MS / 1000:
            counts["good"] += 1

    tasks = []
    before, start = cpu_s(), time.monotonic()
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            break
        delay = start + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.001:
            counts["late_sends"] += 1
        tasks.append(asyncio.create_task(one(rng.choice(names))))
        counts["sent"] += 1
    await asyncio.gather(*tasks)
    wall, cpu = time.monotonic() - start, cpu_s() - before
    stop.set()
    await ticker
    handle.close("benchmark done")
    return {
        "offered": counts["sent"] / seconds,
        "goodput": counts["good"] / seconds,
        "attainment": counts["good"] / max(counts["sent"], 1),
        "cores": cpu / wall,
        "lag_p99_ms": 1000 * float(np.percentile(lags, 99)) if lags else 0.0,
        "late_sends": counts["late_sends"] / max(counts["sent"], 1),
        "shed": counts["shed"] / max(counts["sent"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 5, 10, 20, 40])
    parser.add_argument("--load", type=float, nargs="+", default=[0.5, 1.0], help="of --rate-per-device")
    parser.add_argument("--rate-per-device", type=float, default=250.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-loop-lag-ms", type=float, nargs="+", default=[SLO_MS / 2, 1e9],
                        help="the server's setting; 1e9: never shed (as before it existed)")  # fmt: skip
    args = parser.parse_args()
    print(f"{'devices':>7} {'load':>5} {'max lag':>7} {'offered r/s':>11} {'goodput r/s':>11} {'attainment':>10} "
          f"{'shed':>6} {'cores':>5} {'loop lag p99 ms':>15} {'late sends':>10}")  # fmt: skip
    for devices in args.devices:
        for load in args.load:
            for max_lag in args.max_loop_lag_ms:  # side by side: with the shedding and without
                rate = load * args.rate_per_device * devices
                r = asyncio.run(run_point(devices, rate, args.seconds, args.seed, max_lag))
                print(f"{devices:>7} {load:>5g} {max_lag:>7g} {r['offered']:>11.0f} {r['goodput']:>11.0f} "
                      f"{r['attainment']:>10.2%} {r['shed']:>6.1%} {r['cores']:>5.2f} {r['lag_p99_ms']:>15.1f} "
                      f"{r['late_sends']:>10.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
