"""Profiles recalibrated to what a served run measured (``mainspring profile REPO --from-log DIR``).

``mainspring profile`` times a model alone in a quiet process. Served, the same worker shares its
machine with the controller, the frontends and other tenants, and runs slower: on this 2-core
machine a CPU worker's batches took 10-20% longer at the median than their profiled p99
(``docs/planning.md``). A plan or a simulation from the quiet profile then under-counts the work.
The action log of a served run (``serve --log-dir``) holds every batch's measured duration; this
takes the median of each model's batch sizes and loads from it. A size the run never ran (or too
rarely to trust) keeps its profiled time scaled by how much slower the run's other sizes were.
The simulator's noise model then goes around these medians, as around any profile.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from mainspring.models.profile import ModelProfile

MIN_RUNS = 5  # fewer measured runs of a size than this: scaled from the others instead


@dataclass(frozen=True)
class Served:
    """What one model's served actions took: infers by batch size, and loads (ns)."""

    infers: Mapping[int, list[int]]
    loads: list[int]


def served_durations(actions: Iterable[Mapping[str, str]]) -> dict[str, Served]:
    """Each model's successful infers and loads in an action log (rows as ``read_run`` gives them)."""
    infers: dict[str, dict[int, list[int]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    loads: dict[str, list[int]] = collections.defaultdict(list)
    for action in actions:
        if action["status"] != "ok":
            continue
        took = int(action["end_ns"]) - int(action["begin_ns"])
        if action["kind"] == "infer":
            infers[action["model"]][int(action["batch_size"])].append(took)
        elif action["kind"] == "load":
            loads[action["model"]].append(took)
    return {model: Served(dict(infers.get(model, {})), loads.get(model, [])) for model in set(infers) | set(loads)}


def recalibrated(profile: ModelProfile, served: Served, slowdown: float) -> ModelProfile:
    """``profile`` with the served medians where the run measured enough, and elsewhere its own times
    times ``slowdown`` (the run's median ratio of served to profiled time)."""
    exec_ns = {
        size: round(statistics.median(served.infers[size]))
        if len(served.infers.get(size, ())) >= MIN_RUNS
        else round(ns * slowdown)
        for size, ns in profile.exec_ns.items()
    }
    enough_loads = len(served.loads) >= MIN_RUNS
    load_ns = round(statistics.median(served.loads)) if enough_loads else round(profile.load_ns * slowdown)
    return replace(profile, exec_ns=exec_ns, load_ns=load_ns)


def slowdown_of(profiles: Iterable[ModelProfile], served: Mapping[str, Served]) -> float:
    """The median, over every served infer of a profiled size, of its duration over the profiled time."""
    ratios = [
        took / profile.exec_ns[size]
        for profile in profiles
        if profile.model in served
        for size, durations in served[profile.model].infers.items()
        if size in profile.exec_ns
        for took in durations
    ]
    if not ratios:
        raise ValueError("the log holds no successful infer of a profiled model and batch size")
    return statistics.median(ratios)
