"""Fig. 6: cold starts at scale, as the authors ran it. One device (an emulated V100); a "minor"
resnet50_v2 at 200 r/s (Poisson) runs alone for a lead-in, then 3,600 "major" resnet50_v2 copies
share 1,000 r/s (Poisson), one more becoming active every second: the weight pool holds 201, as the
paper's V100 did, so once that many are active every load evicts.

Per policy: attainment of each class (and of the minor model once memory is full), cold starts,
loads and evictions; over time: active majors, loads per second, load-lane and exec-lane busy, and
each class's attainment. Aim: the minor model at or above 99.9% while the majors cycle, with the
load lane more than half busy.

    .venv/bin/python benchmarks/paper/fig6.py [--duration-s 1200] [--lead-in-s 300] [--quick] [--rows FILE]

``--rows FILE`` appends each policy's counts per 60 s to FILE (a JSON line a bucket) as the run passes
it, then the summary row: a long run cut short keeps what it reached.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from common import OUT, copies, markdown_table, parser, policies_from, side_by_side, write_section

from mainspring.sim.run import SimulationConfig, SimulationResult, Watcher
from mainspring.telemetry.recorder import ActionRow, Recorder, RequestRow
from mainspring.time import NS_PER_S, s_to_ns
from mainspring.workload import Composition, Part, ProgressiveActivation
from mainspring.workload.generators import PoissonOpenLoop

MAJORS = 3600
FIT = 201  # resnet50_v2 copies the paper's V100 held (its 32 GiB less the workspace); our 32 GiB pool holds 292
SUMMARY_HEADER = ["policy", "minor", "minor once memory is full", "major", "goodput r/s", "cold starts",
                  "loads / evictions", "load lane busy once full"]  # fmt: skip
SERIES_HEADER = ["from s", "active majors", "loads/s", "load lane", "exec lane", "minor", "major"]
# INFER5 is the authors' scheduler here; INFER4's load tracker scans every model with demand at each
# load, and here every load evicts: its run does not end in an hour, and the reactive baselines have
# no cold-start planning to compare.
POLICIES = ("clockwork", "infer5")
NOTES = """**Differences:** shortened in time only ({duration} s of their 4,500); the majors split 1,000 r/s
exactly over the active models, Poisson per model, in theirs; here each arrival picks an active model
uniformly, the same process. The README's command passes 100000000 where the controller reads its
schedule-ahead; `infer5` keeps 10 ms. **Headline:** the paper plots goodput, latency, cold starts, PCIe
and GPU busy over time (section 6.2, "Can Clockwork serve thousands?"), without a table.

**The aim is not met, by either scheduler.** The aim was the minor model at 99.9% or more while the majors
cycle, with the load lane more than half busy; the lane is busy, but the minor model stays near 83%
(clockwork) and 92% (INFER5) once memory is full. The majors ask more than the device before memory
fills: in the first minute of majors (1 to 61 active, every one warm) the exec lane is full and the
minor model falls to 55% (clockwork) and 71% (INFER5). 1,200 r/s in all is more than the device serves
at any batch size (736 r/s in batches of 16, 643 in INFER5's batches of 8). Both schedulers share the
overloaded device by deadline order. Clockwork's share admission holds each model to its max-min fair
share of the device, and it weighs a model's demand at batch-1 cost: the minor model asks 0.66 of the
device at that cost but 0.27 in the batches of 16 its rate fills, so it is held below what it needs
while a few majors are active, and with hundreds active it is one model of hundreds. As the majors
spread over more models, fewer of them are warm and each asks for a load, so the load lane, not the
exec lane, limits them, and the minor model recovers over the run. Protecting it needs a rule for whom
to shed past saturation: `share_by_cost` (off by default; `docs/scheduler/admission.md`) weighs demand
at the batch a model's rate fills and gives the models that arrive by the thousand one entry of the fair
level between them. With it on (560 s, seed 1) the minor model meets both aims, 99.992% in the first
minute of majors and 99.967% once memory is full, but the majors get 20.5% against INFER5's 28.5%,
which is why it is not the default."""
AUTHORS_S = 75 * 60  # their run: a 5 min lead-in, then a model a second until 3,600, stopped at 75 min
ROWS_BUCKET_S = 60.0
# A request is answered by its deadline (100 ms) and an action reported soon after it ends: a bucket is
# written once the clock is this far past its end (what is still missing then comes at the end).
ROWS_LATE_S = 10.0
# The whole run's results, measured once (not by ``make paper``): kept in the section when present.
FULL_RUN = Path(__file__).with_name("fig6_full.md")


@dataclass
class Bucket:
    start_s: float
    loads: int = 0
    evictions: int = 0
    load_ns: int = 0
    exec_ns: int = 0
    minor: tuple[int, int] = (0, 0)  # requests, good
    major: tuple[int, int] = (0, 0)

    def add_action(self, a: ActionRow) -> None:
        if a.kind == "load":
            self.loads += 1
            self.load_ns += a.end_ns - a.begin_ns
        elif a.kind == "evict":
            self.evictions += 1
        elif a.kind == "infer":
            self.exec_ns += a.end_ns - a.begin_ns

    def add_request(self, row: RequestRow, minor: bool) -> None:
        n, good = self.minor if minor else self.major
        if minor:
            self.minor = (n + 1, good + row.good)
        else:
            self.major = (n + 1, good + row.good)


def over_time(result: SimulationResult, bucket_s: float, duration_s: float) -> list[Bucket]:
    bucket_ns = int(bucket_s * NS_PER_S)
    buckets = [Bucket(i * bucket_s) for i in range(max(1, int(duration_s // bucket_s)))]
    for a in result.recorder.actions:
        if a.status == "ok" and a.begin_ns // bucket_ns < len(buckets):
            buckets[a.begin_ns // bucket_ns].add_action(a)
    for row in result.recorder.requests:
        index = row.arrival_ns // bucket_ns
        if index < len(buckets):
            buckets[index].add_request(row, result.labels.get(row.request_id) == "minor")
    return buckets


class RowsFile:
    """A ``Watcher`` that appends a policy's buckets to a file as the run passes them: the same counts as
    ``over_time``, read from the recorders each simulated second (the minor model is the first model)."""

    def __init__(self, path: Path, policy: str, minor: str, duration_s: float, majors: ProgressiveActivation) -> None:
        self.path, self.policy, self.minor, self.majors = path, policy, minor, majors
        self.buckets = [Bucket(i * ROWS_BUCKET_S) for i in range(max(1, int(duration_s // ROWS_BUCKET_S)))]
        self.read: list[tuple[int, int]] = []  # per recorder: actions, requests read so far
        self.written = 0
        self.started = 0.0  # when its run first calls: the policies of one process run one after another

    def __call__(self, now_ns: int, recorders: Sequence[Recorder]) -> None:
        bucket_ns = s_to_ns(ROWS_BUCKET_S)
        self.started = self.started or time.perf_counter()
        self.read += [(0, 0)] * (len(recorders) - len(self.read))
        for index, recorder in enumerate(recorders):
            actions, requests = self.read[index]
            for a in recorder.actions[actions:]:
                if a.status == "ok" and a.begin_ns // bucket_ns < len(self.buckets):
                    self.buckets[a.begin_ns // bucket_ns].add_action(a)
            for row in recorder.requests[requests:]:
                if row.arrival_ns // bucket_ns < len(self.buckets):
                    self.buckets[row.arrival_ns // bucket_ns].add_request(row, row.model == self.minor)
            self.read[index] = (len(recorder.actions), len(recorder.requests))
        while self.written < len(self.buckets) and (self.written + 1) * bucket_ns + s_to_ns(ROWS_LATE_S) <= now_ns:
            self.write(self.buckets[self.written])
            self.written += 1

    def finish(self, result: SimulationResult, summary: list[object]) -> None:
        """The buckets the run ended before passing, exact from the whole result, then the summary row."""
        for bucket in over_time(result, ROWS_BUCKET_S, len(self.buckets) * ROWS_BUCKET_S)[self.written :]:
            self.write(bucket)
        self.append({"policy": self.policy, "summary": [str(cell) for cell in summary], "wall_s": self.wall_s})

    def write(self, bucket: Bucket) -> None:
        active = self.majors.active_at(s_to_ns(bucket.start_s), MAJORS)
        self.append({"policy": self.policy, "active_majors": active, **asdict(bucket), "wall_s": self.wall_s})

    @property
    def wall_s(self) -> float:
        return round(time.perf_counter() - self.started, 1)

    def append(self, line: dict[str, object]) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")


def attainment(counts: tuple[int, int]) -> str:
    n, good = counts
    return f"{good / n:.3%}" if n else "-"


def minor_once_full(result: SimulationResult) -> tuple[str, str]:
    """The minor model's attainment from the first eviction on, and the load lane's busy share then."""
    evictions = [a.begin_ns for a in result.recorder.actions if a.kind == "evict" and a.status == "ok"]
    if not evictions:
        return "never full", "-"
    full_ns = min(evictions)
    labels = result.labels
    rows = [r for r in result.recorder.requests if labels.get(r.request_id) == "minor" and r.arrival_ns >= full_ns]
    loads = sum(a.end_ns - a.begin_ns for a in result.recorder.actions
                if a.kind == "load" and a.status == "ok" and a.begin_ns >= full_ns)  # fmt: skip
    span = max(1, result.end_ns - full_ns)
    return attainment((len(rows), sum(r.good for r in rows))), f"{loads / span:.0%}"


def main() -> None:
    p = parser(__doc__, POLICIES)
    p.add_argument("--duration-s", type=float, default=1200.0, help=f"the authors ran {AUTHORS_S} s")
    p.add_argument("--lead-in-s", type=float, default=300.0, help="the minor model alone first (theirs: 300 s)")
    p.add_argument("--rows", type=Path, help=f"append the counts per {ROWS_BUCKET_S:g} s here as the run goes")
    args = p.parse_args()
    duration, lead_in = (60.0, 10.0) if args.quick else (args.duration_s, args.lead_in_s)
    policies = policies_from(args.policy)
    models = copies("resnet50_v2", MAJORS + 1)
    names = tuple(m.model for m in models)
    majors = ProgressiveActivation(1000, initial=1, interval_s=1.0, start_s=lead_in)
    workload = Composition([Part("minor", PoissonOpenLoop(200), names[:1]), Part("major", majors, names[1:])])
    page_bytes = SimulationConfig(duration_ns=1).page_bytes
    pool = FIT * math.ceil(models[0].weights_bytes / page_bytes) * page_bytes
    config = SimulationConfig(duration_ns=s_to_ns(duration), devices=1, pool_bytes=pool, seed=1)
    watchers = {p: RowsFile(args.rows, p, names[0], duration, majors) for p in policies} if args.rows else {}
    watch: dict[str, Watcher] = dict(watchers)
    results = side_by_side(policies, models, workload, config, watch.get)
    rows = []
    for policy, r in results.items():
        rep = r.report
        full_minor, full_load = minor_once_full(r)
        rows.append([policy, f"{rep.by_label['minor']['slo_attainment']:.3%}", full_minor,
                     f"{rep.by_label['major']['slo_attainment']:.3%}", f"{rep.goodput_rps:.0f}", rep.cold_starts,
                     f"{rep.loads} / {rep.evictions}", full_load])  # fmt: skip
        if policy in watchers:
            watchers[policy].finish(r, rows[-1])
    bucket = max(duration / 20, 1.0)
    first = policies[0]
    series = {p: over_time(r, bucket, duration) for p, r in results.items()}
    series_rows = []
    for i, b in enumerate(series[first]):
        row: list[object] = [f"{b.start_s:.0f}", majors.active_at(s_to_ns(b.start_s), MAJORS)]
        for policy in policies:
            mine = series[policy][i]
            lanes = [f"{ns / (bucket * NS_PER_S):.0%}" for ns in (mine.load_ns, mine.exec_ns)]
            row += [f"{mine.loads / bucket:.1f}", *lanes, attainment(mine.minor), attainment(mine.major)]
        series_rows.append(row)
    series_header = SERIES_HEADER[:2] + [f"{name} {p}" for p in policies for name in SERIES_HEADER[2:]]
    plot(results, bucket, duration, majors)
    write_section(
        "fig6",
        "Fig. 6: cold starts at scale (one device, a minor model and 3,600 major models)",
        "**The authors'** (`sec62_fig6`): 3,601 resnet50_v2 copies on one V100 (full at 201), a minor model at "
        "200 r/s (Poisson) alone for 5 minutes, then majors sharing 1,000 r/s, one more active each second up to "
        "3,600, stopped at 75 minutes; 100 ms SLO; INFER5. **Ours:** "
        f"one emulated V100 whose pool holds {FIT} resnet50_v2, as the paper's did; the minor resnet50_v2 at 200 r/s "
        f"(Poisson) alone for {lead_in:g} s, then 3,600 major copies sharing 1,000 r/s (Poisson), one more "
        f"active every second; 100 ms SLO. {duration:g} s: the authors ran {AUTHORS_S} s (to all 3,600 "
        f"active); shortened in time only, it reaches {majors.active_at(s_to_ns(duration), MAJORS):,} active "
        "majors, well past the point where memory is full and every load evicts.",
        markdown_table(SUMMARY_HEADER, rows)
        + f"\n\nOver time (per {bucket:g} s; plot: `out/paper/fig6.png`):\n\n"
        + markdown_table(series_header, series_rows),
        NOTES.format(duration=f"{duration:g}") + (f"\n\n{FULL_RUN.read_text().strip()}" if FULL_RUN.exists() else ""),
    )


def plot(results: dict[str, SimulationResult], bucket: float, duration: float, majors: ProgressiveActivation) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    for policy, r in results.items():
        series = over_time(r, bucket, duration)
        times = [b.start_s for b in series]
        axes[0].plot(times, [b.loads / bucket for b in series], label=policy)
        axes[1].plot(times, [b.load_ns / (bucket * NS_PER_S) for b in series], label=f"{policy} load lane")
        for label, counts in (("minor", [b.minor for b in series]), ("major", [b.major for b in series])):
            share = [good / n if n else float("nan") for n, good in counts]
            axes[2].plot(times, share, label=f"{policy} {label}", linestyle="-" if label == "minor" else ":")
    axes[0].set_ylabel("loads / s")
    axes[1].set_ylabel("load lane busy")
    axes[2].set_ylabel("within SLO")
    axes[2].set_xlabel(f"time (s); majors start at {majors.start_s:g} s, one more a second")
    for axis in axes:
        axis.legend(fontsize=6)
    OUT.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT / "fig6.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
