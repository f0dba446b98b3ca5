"""benchmarks/controller_cost.py splits the policy's CPU time at the end of the warm-up itself (the
simulator's progress hook comes only once per simulated second, which once put the split at 2 s for
a warm-up of 1.5 s and counted a third fewer CPU seconds than requests)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from controller_cost import SplitAtWarmup
from mainspring.models.profile import builtin_profiles
from mainspring.protocol import DeviceSpec
from mainspring.scheduler.clockwork.policy import ClockworkScheduler
from mainspring.scheduler.timed import TimedScheduler
from mainspring.time import ms_to_ns


def test_the_cpu_before_the_first_call_after_the_warm_up_is_the_warm_up_s() -> None:
    timed = TimedScheduler(ClockworkScheduler({p.model: p for p in builtin_profiles()}, [DeviceSpec(0)]))
    split = SplitAtWarmup(timed, warm_ns=ms_to_ns(1500))
    for now_ms in (0, 500, 1499):
        split.schedule(ms_to_ns(now_ms))
        assert split.warm_cpu_ns is None
    before = timed.cpu_ns
    split.schedule(ms_to_ns(1500))
    assert split.warm_cpu_ns == before
    split.schedule(ms_to_ns(2000))
    assert split.warm_cpu_ns == before  # taken once
