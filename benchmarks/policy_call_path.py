"""How often following a request from ``ClockworkScheduler.on_request`` returns to a module already left.

Each module of ``scheduler/clockwork/`` is a room. While the policy takes one request, a profiler
(``sys.setprofile``) notes the room the innermost clockwork frame is in at every call and return;
calls elsewhere (the standard library, ``protocol``, ``scheduler/base.py``) leave the room as it was.
Consecutive notes of one room are one visit. A return to a room already left (policy -> admission ->
policy is one) is a place where a reader following the request must go back to a file they had
finished with; issue 57 asks for half as many as its 21.

The requests are those of a small deterministic run (Clockwork's V100 profiles, Poisson arrivals on a
few devices, some models cold); the script prints the count for the first request (a cold model: the
longest path) and the median and largest over every request.

    .venv/bin/python benchmarks/policy_call_path.py [--devices 2] [--models 40] [--rate 300] [--show]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.protocol import Request
from mainspring.scheduler.clockwork import policy as clockwork_policy
from mainspring.scheduler.clockwork.policy import ClockworkScheduler
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import NS_PER_S
from mainspring.workload import PoissonOpenLoop

ROOMS = str(Path(clockwork_policy.__file__).parent) + "/"


def _room(frame: FrameType | None) -> str | None:
    """The clockwork module of the innermost clockwork frame from ``frame`` out (None: outside the policy)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(ROOMS):
            return name[len(ROOMS) : -len(".py")]
        frame = frame.f_back
    return None


def visits(take: Callable[[], None]) -> list[str]:
    """The rooms ``take()`` passes through, one entry per visit (consecutive notes of a room merged)."""
    path: list[str] = []

    def note(frame: FrameType, event: str, _: Any) -> None:
        if event == "call":
            room = _room(frame)
        elif event == "return":
            room = _room(frame.f_back)
        else:
            return  # a C function: the room stays
        if room is not None and (not path or path[-1] != room):
            path.append(room)

    sys.setprofile(note)
    try:
        take()
    finally:
        sys.setprofile(None)
    return path


def returns_to_rooms_left(path: list[str]) -> int:
    """Visits to a room that the path had already been in and left."""
    return sum(1 for i, room in enumerate(path) if room in path[:i])


def measure(devices: int, models: int, rate: float, seconds: float, seed: int) -> list[list[str]]:
    """Every request's path through the rooms, in the order the requests came."""
    paths: list[list[str]] = []
    original = ClockworkScheduler.on_request

    def traced(self: ClockworkScheduler, request: Request, now_ns: int) -> None:
        paths.append(visits(lambda: original(self, request, now_ns)))

    profiles = model_copies(builtin_profiles(), models)
    config = SimulationConfig(duration_ns=round(seconds * NS_PER_S), devices=devices, seed=seed)
    ClockworkScheduler.on_request = traced  # type: ignore[method-assign]
    try:
        simulate("clockwork", profiles, PoissonOpenLoop(rate), config)
    finally:
        ClockworkScheduler.on_request = original  # type: ignore[method-assign]
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--models", type=int, default=40, help="copies of the profiles")
    parser.add_argument("--rate", type=float, default=300.0, help="requests/s")
    parser.add_argument("--duration-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", action="store_true", help="print the first request's path")
    args = parser.parse_args()
    paths = measure(args.devices, args.models, args.rate, args.duration_s, args.seed)
    counts = [returns_to_rooms_left(p) for p in paths]
    print(f"returns to a room already left, following on_request: {counts[0]} for the first request; "
          f"median {statistics.median(counts):g}, at most {max(counts)} over {len(counts)} requests")  # fmt: skip
    if args.show:
        print(" -> ".join(paths[0]))


if __name__ == "__main__":
    main()
