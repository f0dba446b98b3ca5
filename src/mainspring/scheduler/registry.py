"""Policies by name, so every comparison runs side by side in one harness."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence

from mainspring.models.profile import ModelProfile
from mainspring.protocol import DeviceSpec
from mainspring.scheduler.base import Scheduler
from mainspring.scheduler.baselines.clipper import ClipperScheduler
from mainspring.scheduler.baselines.reactive import ReactiveConfig
from mainspring.scheduler.baselines.triton import TritonScheduler
from mainspring.scheduler.clockwork import ClockworkConfig, ClockworkScheduler
from mainspring.scheduler.infer4 import Infer4Scheduler
from mainspring.scheduler.infer5 import Infer5Scheduler
from mainspring.time import NS_PER_MS

# profiles, devices, seeded generator, deadline margin (ns: the result's trip back to the client, which
# every request's ``ready_by_ns`` already takes off; clockwork's tight-class guard plans by it too)
SchedulerFactory = Callable[[Mapping[str, ModelProfile], Sequence[DeviceSpec], random.Random, int], Scheduler]


def clockwork_config(settings: Mapping[str, object], where: str, margin_ns: int = 0) -> ClockworkConfig:
    """The clockwork policy's config with a user's ``settings``, each checked (errors name ``where``)."""
    return ClockworkConfig(deadline_margin_ms=margin_ns / 1e6).with_settings(settings, where)


def _clockwork(settings: Mapping[str, object] | None = None, where: str = "") -> SchedulerFactory:
    return lambda profiles, devices, rng, margin_ns: ClockworkScheduler(
        profiles, devices, clockwork_config(settings or {}, where, margin_ns), rng
    )


# Policies whose settings a user may change (``serve``'s ``[clockwork]`` table, ``simulate --clockwork``):
# each makes its factory from the settings and where they came from.
_WITH_SETTINGS: dict[str, Callable[[Mapping[str, object], str], SchedulerFactory]] = {"clockwork": _clockwork}
SETTABLE = tuple(_WITH_SETTINGS)

_FACTORIES: dict[str, SchedulerFactory] = {
    "clockwork": _clockwork(),
    # INFER4 keeps its own 5 ms buffer before every deadline; the baselines plan no deadlines.
    "infer4": lambda profiles, devices, rng, margin_ns: Infer4Scheduler(profiles, devices, rng),
    # INFER5, the scheduler of the authors' Figs. 5-8 and 11: schedule-ahead 10 ms, batches of at most 8. Its
    # send gate holds an action for the trip to its worker: the margin (the trip back, the same network).
    "infer5": lambda profiles, devices, rng, margin_ns: Infer5Scheduler(
        profiles, devices, rng, network_trip_ns=margin_ns
    ),
    # The same with schedule-ahead 5 ms, as the authors ran it for Figs. 7, 8 and 11.
    "infer5-5ms": lambda profiles, devices, rng, margin_ns: Infer5Scheduler(
        profiles, devices, rng, network_trip_ns=margin_ns, schedule_ahead_ns=5 * NS_PER_MS
    ),
    "triton": lambda profiles, devices, rng, margin_ns: TritonScheduler(profiles, devices, ReactiveConfig()),
    "clipper": lambda profiles, devices, rng, margin_ns: ClipperScheduler(profiles, devices, ReactiveConfig()),
}

DEFAULT_POLICY = "clockwork"


def policy_names() -> list[str]:
    return list(_FACTORIES)


def parse_policies(text: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``, with a clear error for an unknown or repeated name."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError("no policy given")
    unknown = [name for name in names if name not in _FACTORIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; choose from {', '.join(_FACTORIES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"policy listed twice: {text}")
    return names


def make_scheduler(
    name: str,
    profiles: Mapping[str, ModelProfile],
    devices: Sequence[DeviceSpec],
    rng: random.Random,
    deadline_margin_ns: int = 0,
    settings: Mapping[str, object] | None = None,
    where: str = "policy settings",
) -> Scheduler:
    """Policy ``name``; ``settings`` (field: value) change a settable policy's defaults."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(_FACTORIES)}") from None
    if settings:
        if name not in _WITH_SETTINGS:
            raise ValueError(f"{where}: policy {name!r} takes no settings (only {', '.join(SETTABLE)} does)")
        factory = _WITH_SETTINGS[name](settings, where)
    return factory(profiles, devices, rng, deadline_margin_ns)
