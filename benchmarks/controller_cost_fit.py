"""Calibrate the simulator's controller-cost model (``mainspring.cells.cost``): the policy's thread
time per call, fitted by least squares to the per-call terms of ``ControllerCost``.

Runs the clockwork policy in the simulator at 1, 4, 8 and 16 devices (the sizes of one cell), 50
model copies per device, Poisson at --rate-per-device, times every call of the contract, and
prints the fitted coefficients beside the ones in ``CLOCKWORK_COST`` with the ratio of what each
predicts to what was measured on each run (measured here, in one run).

    .venv/bin/python benchmarks/controller_cost_fit.py [--devices 1 4 8 16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mainspring.cells.cost import CLOCKWORK_COST, ControllerCost
from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.protocol import ActionResult, Request
from mainspring.scheduler.base import Decisions, Scheduler
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import s_to_ns
from mainspring.workload import PoissonOpenLoop

TERMS = ("request_ns", "result_ns", "pass_ns", "pass_per_device_ns", "action_ns", "answer_ns")


class CallLog:
    """Times every call of the contract; one row of term counts and the measured ns per call."""

    def __init__(self, inner: Scheduler, devices: int, warm_ns: int) -> None:
        self.inner = inner
        self.devices = devices
        self.warm_ns = warm_ns
        self.rows: list[tuple[float, ...]] = []
        self.measured: list[int] = []

    def _keep(self, now_ns: int, row: tuple[float, ...], ns: int) -> None:
        if now_ns >= self.warm_ns:
            self.rows.append(row)
            self.measured.append(ns)

    def on_request(self, request: Request, now_ns: int) -> None:
        started = time.thread_time_ns()
        self.inner.on_request(request, now_ns)
        self._keep(now_ns, (1, 0, 0, 0, 0, 0), time.thread_time_ns() - started)

    def on_result(self, result: ActionResult, now_ns: int) -> None:
        started = time.thread_time_ns()
        self.inner.on_result(result, now_ns)
        self._keep(now_ns, (0, 1, 0, 0, 0, 0), time.thread_time_ns() - started)

    def schedule(self, now_ns: int) -> Decisions:
        started = time.thread_time_ns()
        decisions = self.inner.schedule(now_ns)
        row = (0, 0, 1, self.devices, len(decisions.actions), len(decisions.responses))
        self._keep(now_ns, row, time.thread_time_ns() - started)
        return decisions

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def run(devices: int, rate: float, seconds: float) -> CallLog:
    logs: list[CallLog] = []

    def wrap(scheduler: Scheduler) -> Scheduler:
        logs.append(CallLog(scheduler, devices, s_to_ns(2)))
        return logs[-1]

    models = model_copies(builtin_profiles(), 50 * devices)
    config = SimulationConfig(duration_ns=s_to_ns(seconds), warmup_ns=s_to_ns(2), devices=devices, seed=5)
    simulate("clockwork", models, PoissonOpenLoop(rate * devices), config, wrap=wrap)
    return logs[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--rate-per-device", type=float, default=250.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    logs = [run(n, args.rate_per_device, args.seconds) for n in args.devices]
    rows = np.array([row for log in logs for row in log.rows], dtype=float)
    measured = np.array([ns for log in logs for ns in log.measured], dtype=float)
    fitted, *_ = np.linalg.lstsq(rows, measured, rcond=None)
    fit = ControllerCost(*(max(0, int(round(float(v), -2))) for v in fitted))
    print("term                 fitted     in CLOCKWORK_COST")
    for name in TERMS:
        print(f"{name:<18} {getattr(fit, name):>9,} {getattr(CLOCKWORK_COST, name):>12,}")
    print(f"\n{'devices':>7} {'calls':>8} {'measured us/req':>15} {'fit/measured':>12} {'model/measured':>14}")
    for n, log in zip(args.devices, logs, strict=True):
        part = np.array(log.rows, dtype=float)
        requests = max(1.0, float(part[:, 0].sum()))
        total = float(np.sum(log.measured))
        modelled = float((part @ np.array([getattr(CLOCKWORK_COST, t) for t in TERMS], dtype=float)).sum())
        fitted_total = float((part @ fitted).sum())
        print(f"{n:>7} {len(log.rows):>8} {total / requests / 1000:>15.1f} {fitted_total / total:>12.2f}"
              f" {modelled / total:>14.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
