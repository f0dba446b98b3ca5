"""Where the clockwork policy's time goes: its calls and the main steps of a pass, timed apart.

The workload is ``controller_cost.py``'s (N devices, 50 model copies each, Poisson at 250 r/s per
device, every model starting cold); only calls after the warm-up count. Each pass is put down to
what came before it: an arrival (``on_request``), a result (``on_result``) or a wake-up. The
timers wrap the policy's own methods, so they add a few per cent; the shares are what to read.

    .venv/bin/python benchmarks/policy_breakdown.py [--devices 32] [--warmup-s 1.5] [--duration-s 1.5]
    .venv/bin/python benchmarks/policy_breakdown.py --visits --devices 1 8 32   # what a weighing visits

With ``--visits`` nothing is timed: each run counts what the weighing visits per batch planned (the
waiting models of the device, and how many devices hold each), which is why a request costs more
on more devices: it waits on every device that holds its model, and each of them weighs it.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.protocol import ActionResult, Request
from mainspring.scheduler.base import Decisions, Scheduler
from mainspring.scheduler.clockwork.batching import Choice
from mainspring.scheduler.clockwork.policy import ClockworkScheduler
from mainspring.scheduler.clockwork.tracker import DeviceState
from mainspring.scheduler.timed import TimedScheduler
from mainspring.sim.run import SimulationConfig, SimulationResult, simulate
from mainspring.time import s_to_ns
from mainspring.workload import PoissonOpenLoop

# (owner of the method, seen from the policy; method; label)
STEPS = (
    ("", "_plan_infers", "planning infers"),
    ("batches", "weigh", "weighing"),
    ("batches", "trade_off", "trade-off"),
    ("", "_issue_infer", "issuing infers"),
    ("loads", "plan", "load planning"),
    ("strands", "spill", "strand check"),
    ("strands", "take_changes", "strand changes"),
    ("", "_next_wakeup", "next wake-up"),
    ("", "_expire", "queue expiry"),
    ("estimator", "expire", "estimate ageing"),
)


class Breakdown:
    """Wraps the timed policy: CPU time per (pass kind, part) after the warm-up."""

    def __init__(self, timed: TimedScheduler, warm_ns: int) -> None:
        self.timed = timed
        self.warm_ns = warm_ns
        self.cpu: Counter[tuple[str, str]] = Counter()
        self.calls: Counter[tuple[str, str]] = Counter()
        self._kind = "wake-up"
        self._now = 0
        policy = timed.inner
        assert isinstance(policy, ClockworkScheduler)
        for owner, method, label in STEPS:
            target = getattr(policy, owner) if owner else policy
            setattr(target, method, self._timer(getattr(target, method), label))

    def _timer(self, method: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any) -> Any:
            started = time.thread_time_ns()
            result = method(*args)
            self._count(label, time.thread_time_ns() - started)
            return result

        return timed

    def _count(self, label: str, cpu_ns: int) -> None:
        if self._now >= self.warm_ns:
            self.cpu[(self._kind, label)] += cpu_ns
            self.calls[(self._kind, label)] += 1

    def _call(self, kind: str, label: str, now_ns: int, call: Callable[[], Any]) -> Any:
        self._kind, self._now = kind, now_ns
        started = time.thread_time_ns()
        result = call()
        self._count(label, time.thread_time_ns() - started)
        return result

    def on_request(self, request: Request, now_ns: int) -> None:
        self._call("arrival", "on_request", now_ns, lambda: self.timed.on_request(request, now_ns))

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        self._call("result", "on_result", now_ns, lambda: self.timed.on_result(result, now_ns))

    def schedule(self, now_ns: int) -> Decisions:
        decisions: Decisions = self._call(self._kind, "pass", now_ns, lambda: self.timed.schedule(now_ns))
        self._kind = "wake-up"  # until the next arrival or result
        return decisions

    def __getattr__(self, name: str) -> object:
        return getattr(self.timed, name)


class Visits:
    """Counts, for every weighing after the warm-up, the models it visits and their holders."""

    def __init__(self, policy: ClockworkScheduler, warm_ns: int) -> None:
        self.weighings = self.waiting = self.holders = 0
        weigh, holding = policy.batches.weigh, policy.residency.holding

        def counted(device: DeviceState, start_ns: int, now_ns: int) -> list[Choice]:
            if now_ns >= warm_ns:
                models = [m for m in device.waiting if m not in device.loading]
                self.weighings += 1
                self.waiting += len(models)
                self.holders += sum(len(holding(m)) for m in models)
            return weigh(device, start_ns, now_ns)

        policy.batches.weigh = counted  # type: ignore[method-assign]


def visits(devices: int, rate_per_device: float, warmup_s: float, duration_s: float) -> tuple[Visits, int]:
    """What the weighings of ``breakdown``'s workload visit, untimed, and the requests after the warm-up."""
    found: list[Visits] = []

    def wrap(scheduler: Scheduler) -> Scheduler:
        assert isinstance(scheduler, TimedScheduler) and isinstance(scheduler.inner, ClockworkScheduler)
        found.append(Visits(scheduler.inner, s_to_ns(warmup_s)))
        return scheduler

    result = _simulate(devices, rate_per_device, warmup_s, duration_s, wrap)
    return found[0], _after_warmup(result, s_to_ns(warmup_s))


def _after_warmup(result: SimulationResult, warm_ns: int) -> int:
    return sum(1 for r in result.recorder.requests if r.arrival_ns >= warm_ns)


def _simulate(
    devices: int, rate_per_device: float, warmup_s: float, duration_s: float, wrap: Callable[[Scheduler], Scheduler]
) -> SimulationResult:
    models = model_copies(builtin_profiles(), 50 * devices)
    config = SimulationConfig(duration_ns=s_to_ns(duration_s), warmup_ns=s_to_ns(warmup_s), devices=devices, seed=3)
    return simulate("clockwork", models, PoissonOpenLoop(rate_per_device * devices), config, wrap=wrap)


def breakdown(devices: int, rate_per_device: float, warmup_s: float, duration_s: float) -> tuple[Breakdown, int]:
    """The run's breakdown and the number of requests that arrived after the warm-up."""
    warm_ns = s_to_ns(warmup_s)
    found: list[Breakdown] = []

    def wrap(scheduler: Scheduler) -> Scheduler:
        assert isinstance(scheduler, TimedScheduler)
        found.append(Breakdown(scheduler, warm_ns))
        return found[0]

    result = _simulate(devices, rate_per_device, warmup_s, duration_s, wrap)
    return found[0], _after_warmup(result, warm_ns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[32])
    parser.add_argument("--rate-per-device", type=float, default=250.0)
    parser.add_argument("--warmup-s", type=float, default=1.5)
    parser.add_argument("--duration-s", type=float, default=1.5)
    parser.add_argument("--visits", action="store_true", help="count what each weighing visits instead of timing")
    args = parser.parse_args()
    for devices in args.devices:
        if args.visits:
            seen, requests = visits(devices, args.rate_per_device, args.warmup_s, args.duration_s)
            print(
                f"{devices:>4} devices: {seen.weighings / max(requests, 1):.2f} weighings per request,"
                f" {seen.waiting / max(seen.weighings, 1):.1f} waiting models each (held by"
                f" {seen.holders / max(seen.waiting, 1):.2f} devices on average):"
                f" {seen.waiting / max(requests, 1):.1f} models weighed per request"
            )
        else:
            print_breakdown(devices, args.rate_per_device, args.warmup_s, args.duration_s)


def print_breakdown(devices: int, rate_per_device: float, warmup_s: float, duration_s: float) -> None:
    parts, requests = breakdown(devices, rate_per_device, warmup_s, duration_s)
    top = ("on_request", "on_result", "pass")
    total = sum(cpu for (_, label), cpu in parts.cpu.items() if label in top)
    each_us = total / 1000 / max(requests, 1)
    print(f"{devices} devices: {requests} requests after the warm-up, {each_us:.1f} us of policy CPU each")
    for kind in ("arrival", "result", "wake-up"):
        entries = sorted(((cpu, label) for (k, label), cpu in parts.cpu.items() if k == kind), reverse=True)
        for cpu, label in entries:
            calls = parts.calls[(kind, label)]
            print(f"{kind:>8} {label:<16} {calls:>8} calls {100 * cpu / max(total, 1):6.1f}%")


if __name__ == "__main__":
    main()
