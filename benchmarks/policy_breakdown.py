"""Where the clockwork policy's time goes: its calls and the main steps of a pass, timed apart.

The workload is ``controller_cost.py``'s (N devices, 50 model copies each, Poisson at 250 r/s per
device, every model starting cold); only calls after the warm-up count. Each pass is put down to
what came before it: an arrival (``on_request``), a result (``on_result``) or a wake-up. The
timers wrap the policy's own methods, so they add a few per cent; the shares are what to read.

    .venv/bin/python benchmarks/policy_breakdown.py [--devices 32] [--warmup-s 1.5] [--duration-s 1.5]
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
from mainspring.scheduler.clockwork.policy import ClockworkScheduler
from mainspring.scheduler.timed import TimedScheduler
from mainspring.sim.run import SimulationConfig, simulate
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


def breakdown(devices: int, rate_per_device: float, warmup_s: float, duration_s: float) -> tuple[Breakdown, int]:
    """The run's breakdown and the number of requests that arrived after the warm-up."""
    warm_ns = s_to_ns(warmup_s)
    found: list[Breakdown] = []

    def wrap(scheduler: Scheduler) -> Scheduler:
        assert isinstance(scheduler, TimedScheduler)
        found.append(Breakdown(scheduler, warm_ns))
        return found[0]

    models = model_copies(builtin_profiles(), 50 * devices)
    config = SimulationConfig(duration_ns=s_to_ns(duration_s), warmup_ns=warm_ns, devices=devices, seed=3)
    result = simulate("clockwork", models, PoissonOpenLoop(rate_per_device * devices), config, wrap=wrap)
    steady = sum(1 for r in result.recorder.requests if r.arrival_ns >= warm_ns)
    return found[0], steady


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=32)
    parser.add_argument("--rate-per-device", type=float, default=250.0)
    parser.add_argument("--warmup-s", type=float, default=1.5)
    parser.add_argument("--duration-s", type=float, default=1.5)
    args = parser.parse_args()
    parts, requests = breakdown(args.devices, args.rate_per_device, args.warmup_s, args.duration_s)
    top = ("on_request", "on_result", "pass")
    total = sum(cpu for (_, label), cpu in parts.cpu.items() if label in top)
    print(f"{requests} requests after the warm-up, {total / 1000 / max(requests, 1):.1f} us of policy CPU each")
    for kind in ("arrival", "result", "wake-up"):
        entries = sorted(((cpu, label) for (k, label), cpu in parts.cpu.items() if k == kind), reverse=True)
        for cpu, label in entries:
            calls = parts.calls[(kind, label)]
            print(f"{kind:>8} {label:<16} {calls:>8} calls {100 * cpu / max(total, 1):6.1f}%")


if __name__ == "__main__":
    main()
