"""Controller cost: scheduler CPU time per request, and how many emulated devices one core keeps saturated.

The load ramps with the number of devices (as in Clockwork's Fig. 11): N devices,
50 model copies each, Poisson arrivals at --rate-per-device. The policy's CPU time
is measured around every call (on_request, on_result, schedule) in the simulator
(``policy_cpu_us_per_request`` of every simulation report), so it excludes the
emulation. Every model starts cold, so the first --warmup-s simulated seconds (loads
everywhere) are reported apart from the steady state after them. One core keeps N
devices saturated in real time while the policy needs less than one CPU second per
simulated second.

    .venv/bin/python benchmarks/controller_cost.py [--devices 1 8 32 150] [--policy clockwork]
    PYTHONPATH=<another checkout>/src .venv/bin/python benchmarks/controller_cost.py   # its code, same harness
"""

from __future__ import annotations

import argparse

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.protocol import ActionResult, Request
from mainspring.scheduler.base import Decisions, Scheduler
from mainspring.scheduler.registry import parse_policies
from mainspring.scheduler.timed import TimedScheduler
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import s_to_ns
from mainspring.workload import PoissonOpenLoop


class SplitAtWarmup:
    """Passes the contract's calls on to the timed policy, noting its CPU time at the first call at
    or after the warm-up's end (the simulator's progress hook comes once per simulated second only)."""

    def __init__(self, timed: TimedScheduler, warm_ns: int) -> None:
        self.timed = timed
        self.warm_ns = warm_ns
        self.warm_cpu_ns: int | None = None

    def _note(self, now_ns: int) -> None:
        if self.warm_cpu_ns is None and now_ns >= self.warm_ns:
            self.warm_cpu_ns = self.timed.cpu_ns

    def on_request(self, request: Request, now_ns: int) -> None:
        self._note(now_ns)
        self.timed.on_request(request, now_ns)

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        self._note(now_ns)
        self.timed.on_result(result, now_ns)

    def schedule(self, now_ns: int) -> Decisions:
        self._note(now_ns)
        return self.timed.schedule(now_ns)

    def __getattr__(self, name: str) -> object:  # membership calls and the like reach the policy
        return getattr(self.timed, name)


def measure(policy: str, devices: int, rate_per_device: float, warmup_s: float, duration_s: float) -> dict[str, float]:
    """Policy CPU per request during the warm-up and after it, goodput and busy share of the run."""
    warm_ns = s_to_ns(warmup_s)
    timed: list[SplitAtWarmup] = []

    def keep(scheduler: Scheduler) -> Scheduler:
        assert isinstance(scheduler, TimedScheduler)
        timed.append(SplitAtWarmup(scheduler, warm_ns))
        return timed[-1]

    models = model_copies(builtin_profiles(), 50 * devices)
    config = SimulationConfig(duration_ns=s_to_ns(duration_s), warmup_ns=s_to_ns(warmup_s), devices=devices, seed=3)
    result = simulate(policy, models, PoissonOpenLoop(rate_per_device * devices), config, wrap=keep)
    report = result.recorder.requests
    warm_requests = sum(1 for r in report if r.arrival_ns < warm_ns)
    steady_requests = len(report) - warm_requests
    split = timed[0]
    warm_cpu = split.timed.cpu_ns if split.warm_cpu_ns is None else split.warm_cpu_ns
    steady_cpu = split.timed.cpu_ns - warm_cpu
    return {
        "offered": result.report.offered_rps,
        "goodput": result.report.goodput_rps,
        "busy": result.report.device_busy,
        "warm_us": warm_cpu / 1000 / max(warm_requests, 1),
        "steady_us": steady_cpu / 1000 / max(steady_requests, 1),
        "cpu_per_sim_s": steady_cpu / max(s_to_ns(duration_s), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 8, 32, 150])
    parser.add_argument("--rate-per-device", type=float, default=250.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--duration-s", type=float, default=3.0, help="simulated seconds measured after the warm-up")
    parser.add_argument("--policy", default="clockwork,triton")
    args = parser.parse_args()
    print(
        f"{'policy':>10} {'devices':>7} {'offered r/s':>11} {'goodput r/s':>11} {'busy':>5}"
        f" {'warm-up us/req':>14} {'steady us/req':>13} {'steady r/s per core':>19} {'cpu s per sim s':>15}"
    )
    for policy in parse_policies(args.policy):
        saturated = 0
        for n in args.devices:
            m = measure(policy, n, args.rate_per_device, args.warmup_s, args.duration_s)
            if m["cpu_per_sim_s"] < 1.0:
                saturated = n
            print(
                f"{policy:>10} {n:>7} {m['offered']:>11.0f} {m['goodput']:>11.0f} {m['busy']:>5.0%}"
                f" {m['warm_us']:>14.1f} {m['steady_us']:>13.1f} {1e6 / m['steady_us']:>19.0f}"
                f" {m['cpu_per_sim_s']:>15.3f}",
                flush=True,
            )
        print(f"{policy}: after the warm-up one core keeps up in real time with up to {saturated} devices tried\n")


if __name__ == "__main__":
    main()
