"""Profiles recalibrated to what a served run measured (``mainspring profile REPO --from-log DIR``).

``mainspring profile`` times a model alone in a quiet process. Served, the same worker shares its
machine with the controller, the frontends and other tenants, and runs slower: on this 2-core
machine a CPU worker's batches took 10-20% longer at the median than their profiled p99
(``docs/planning.md``). A plan or a simulation from the quiet profile then under-counts the work.
The action log of a served run (``serve --log-dir``) holds every batch's measured duration; this
takes the median of each model's batch sizes and loads from it. A size the run never ran (or too
rarely to trust) keeps its profiled time scaled by how much slower the run's other sizes were.
The simulator's noise model then goes around these medians, as around any profile.

A log that cannot be a run of these profiles is refused (``ServedLogError``, naming the action or
the model and why) before anything is written: a time that is no integer or ends before it
begins, fewer than ``MIN_RUNS`` infers in all, or a median (or the run's slowdown) outside
``PLAUSIBLE`` times its profiled time. One hand-edited row once made every time 1e-6 ms.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from mainspring.models.profile import ModelProfile

MIN_RUNS = 5  # fewer measured runs of a size than this: scaled from the others instead
PLAUSIBLE = (0.2, 10.0)  # served over profiled time: outside this, the log is not of these models on this device
MAX_ACTION_NS = 3600 * 10**9  # an action that took longer than an hour is a damaged row


class ServedLogError(ValueError):
    """A log no profile should be recalibrated from; the message names the action or model and why."""


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
        took = _took(action)
        if action["kind"] == "infer":
            infers[action["model"]][_batch_size(action)].append(took)
        elif action["kind"] == "load":
            loads[action["model"]].append(took)
    return {model: Served(dict(infers.get(model, {})), loads.get(model, [])) for model in set(infers) | set(loads)}


def _took(action: Mapping[str, str]) -> int:
    """One action's duration (ns), or a ``ServedLogError`` naming the action where it cannot be one."""
    where = f"action {action.get('action_id', '?')} ({action.get('model', '?')})"
    try:
        begin, end = int(action["begin_ns"]), int(action["end_ns"])
    except ValueError:
        raise ServedLogError(f"{where}: begin_ns {action['begin_ns'][:30]!r} and end_ns {action['end_ns'][:30]!r} "
                             "must be integers (ns)") from None  # fmt: skip
    if begin < 0 or end < begin:
        raise ServedLogError(f"{where}: ends before it begins (begin_ns {begin}, end_ns {end})")
    if end - begin > MAX_ACTION_NS:
        raise ServedLogError(f"{where}: took {(end - begin) / 1e9:.3g} s, more than an action can (an hour)")
    return end - begin


def _batch_size(action: Mapping[str, str]) -> int:
    text = action["batch_size"]
    if not text.isdigit() or not 0 < int(text) <= 1 << 20:
        raise ServedLogError(f"action {action.get('action_id', '?')} ({action.get('model', '?')}): batch_size "
                             f"{text[:30]!r} is not a batch size")  # fmt: skip
    return int(text)


def recalibrated(profile: ModelProfile, served: Served, slowdown: float) -> ModelProfile:
    """``profile`` with the served medians where the run measured enough, and elsewhere its own times
    times ``slowdown`` (the run's median ratio of served to profiled time). A median outside
    ``PLAUSIBLE`` times the profiled time is a ``ServedLogError`` naming the model and size."""
    exec_ns = {}
    for size, ns in profile.exec_ns.items():
        runs = served.infers.get(size, [])
        exec_ns[size] = (
            _plausible(profile.model, f"batch {size}", runs, ns) if len(runs) >= MIN_RUNS else round(ns * slowdown)
        )
    enough_loads = len(served.loads) >= MIN_RUNS
    load_ns = (
        _plausible(profile.model, "load", served.loads, profile.load_ns)
        if enough_loads
        else round(profile.load_ns * slowdown)
    )
    return replace(profile, exec_ns=exec_ns, load_ns=load_ns)


def _plausible(model: str, what: str, durations: list[int], profiled_ns: int) -> int:
    """The median of ``durations``, where it lies within ``PLAUSIBLE`` times ``profiled_ns``."""
    median = round(statistics.median(durations))
    low, high = PLAUSIBLE
    if not low * profiled_ns <= median <= high * profiled_ns:
        raise ServedLogError(
            f"model {model}, {what}: the served median {median / 1e6:.4g} ms is {median / max(profiled_ns, 1):.3g}x "
            f"its profiled {profiled_ns / 1e6:.4g} ms, outside {low:g}-{high:g}x: not this model on this device"
        )
    return median


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
    if len(ratios) < MIN_RUNS:
        raise ServedLogError(f"the log holds {len(ratios)} successful infer(s) of a profiled model and batch size; "
                             f"at least {MIN_RUNS} are needed to rescale the profiles")  # fmt: skip
    slowdown = statistics.median(ratios)
    low, high = PLAUSIBLE
    if not low <= slowdown <= high:
        raise ServedLogError(f"the run's infers took {slowdown:.3g}x their profiled times (median), outside "
                             f"{low:g}-{high:g}x: not these models on this device")  # fmt: skip
    return slowdown
