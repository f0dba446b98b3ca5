"""Fig. 8: can the latency-sensitive be isolated from batch clients? 6 devices; 6 latency-sensitive
models under an SLO that grows step by step from a multiple of their batch-1 time, beside background
closed-loop batch clients (none, 12 clients x 16 outstanding, 48 x 4) with a relaxed SLO.

Two settings: ours (200 r/s per model, evenly spaced, from 2x the profile's batch-1 time, a 1 s batch
SLO) and the authors' (200 r/s in all, Poisson, from 1x their unit, 2.9 ms (``--slo-unit-ms``), a one-day
batch SLO; their 30 s steps shortened to ``--step-s``).
Per step: each class's attainment per policy, and the non-preemptive bound: the largest batch of the
batch model after which a batch of one still ends within the SLO (a request that arrives as that
batch starts on its device waits for all of it).

    .venv/bin/python benchmarks/paper/fig8.py [--duration-s 60] [--step-s 5] [--slo-unit-ms 2.9] [--quick]
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from common import (
    add_slo_unit,
    markdown_table,
    parser,
    policies_from,
    pyplot,
    resnet50_copies,
    save_plot,
    side_by_side,
    slo_unit,
    write_section,
)

from mainspring.models.profile import ModelProfile
from mainspring.sim.run import SimulationConfig, SimulationResult
from mainspring.time import ms_to_ns, ns_to_ms, s_to_ns
from mainspring.workload import ClosedLoop, Composition, FixedRate, Part, SloSweep, Workload
from mainspring.workload.generators import PoissonOpenLoop

MIXES = [(0, 0), (12, 16), (48, 4)]
NOTES = """How to read the steps: a closed-loop batch client keeps its model's queue full, so its batches are
as large as its outstanding requests allow: up to 16 (21.7 ms) with 12 x 16, up to 4 (7.5 ms) with
48 x 4. A latency-sensitive request that reaches a device as such a batch starts waits for all of it;
`bound` is the largest batch it can wait for on that one device; `none`: not even a batch of one.
`clockwork-noguard` is the policy as it was before the tight-class guard (`guard_tight=false`): every
device runs the least-slack batch whole, and the class falls to 13-36% at 11.2 ms and 78% at 16.8 ms in
the authors' setting, 0-22% at 6.6-10 ms in ours. The guard (`scheduler/clockwork/guard.py`,
`docs/scheduler/tight-class.md`) keeps enough devices responsive for the class (its batch-1 work
at half a device each), holds every latency-sensitive model on each, and there cuts the batch model's
batches to leave room for two of the class's requests; the other devices run whole batches. The
capacity left is the batch clients' goodput with the devices to themselves times the share the class
alone leaves idle.

**The aim** (where the class alone reaches 99.9%, 99.5% with either batch mix, and the batch goodput at
least 80% of the capacity left; the figures below were measured with 1x at the profile's 3.32 ms in both
settings, `--slo-unit-ms 0`, before the authors' 2.9 ms became the authors' setting's default):
- The authors' setting: met at every such step (3 to 11): the class at 100% with both mixes, the batch
  goodput at 85% (12 x 16) and 89% (48 x 4) of the capacity left at steps 3-4, where the guard works,
  and about 100% after. Steps 0-2 do not count (alone 0.10%, 94.19%, 99.59%).
- Ours: the class holds from step 1 (100% with both mixes), but the batch goodput falls to 41-73% of
  the capacity left at steps 1-3 with 12 x 16, and to 56-61% at steps 1-2 with 48 x 4. There the
  class's work is 4 of the 6 devices (1,200 r/s at 3.32 ms),
  so every device is kept responsive and the batch model runs small batches. At step 1 (10 ms) no
  non-preemptive policy does both: two requests of a model arrive 5 ms apart and a batch of two takes
  5.3 ms, so the class runs batches of one and needs its 4 devices at least; below 100% busy it needs 5,
  which leaves one device of whole batches (736 r/s) and a fifth of five devices in batches of one
  (about 300 r/s): 69% of the capacity left at most. At steps 2-3 pairs fit the SLO and four devices
  could carry the class; a count that weighed the class's batching could leave the batch model two
  devices, which the rule's batch-1 count does not.
- What fragments would buy: the next section.

Departures from the authors' setting, besides the ones in each table's setting (and the common ones at
the top): their batch clients start with a 10 s jitter; ours start at once and back off 10 ms after a
rejection. Their steps are 30 s; ours `--step-s` (5 s), about 1 minute in all against 6. **Headline:**
the paper plots this figure without a table (section 6.4, "Can Clockwork isolate performance?"): the
latency-sensitive models unaffected by the batch clients. **Where the port falls short:** our INFER5
(`infer5-5ms`) does not reproduce that, with every rule of `infer5_scheduler.cpp` ported (lasting
strategies, priorities from a timed-out front, its own load tracker, the send gate; measured again on
2026-12-06): with batch clients the class falls to 35-40% at 11.2 ms and 53-76% at 16.8 ms (33-41% and
58-79% before those rules), as `clockwork-noguard` does. In the authors' unit (1x = 2.9 ms, `fig8.py
--policy infer5-5ms`) it is 4-5% at 4.3 ms, 19-26% at 6.5 ms, 35-40% at 9.8 ms, 27-45% at 14.7 ms and
93-100% at 22 ms, alone 66%, 95% and then 100%. Its batches of at most 8 (12.4 ms) still outlast what a
request due in 11.2 ms can wait."""
# The per-step tables: ours, ours without the tight-class guard, and the authors' scheduler.
STEP_POLICIES = ("clockwork", "clockwork-noguard", "infer5-5ms")
POLICIES = ("clockwork", "clockwork-noguard", "infer5-5ms", "infer4", "triton", "clipper")


@dataclass(frozen=True)
class Setting:
    name: str
    latency: Workload  # before the sweep
    start_factor: float
    steps: int
    step_s: float
    batch_slo_ns: int
    unit_ms: float | None = None  # 1x: the profile's batch-1 time where None

    def describe(self) -> str:
        unit = "the batch-1 time" if self.unit_ms is None else f"{self.unit_ms:g} ms"
        return (f"{self.latency.describe()} over the 6 latency-sensitive models, SLO from {self.start_factor:g}x "
                f"{unit} by x1.5 every {self.step_s:g} s ({self.steps} steps); batch SLO "
                f"{ns_to_ms(self.batch_slo_ns) / 1000:g} s")  # fmt: skip

    def sweep(self) -> SloSweep:
        return SloSweep(self.latency, start_factor=self.start_factor, growth=1.5, interval_s=self.step_s,
                        max_factor=100, unit_ms=self.unit_ms)  # fmt: skip


Results = dict[tuple[int, int], dict[str, SimulationResult]]  # per mix of batch clients, per policy
BATCH_ONLY = "batch only"  # the policy key of a mix's run without the latency-sensitive class (clockwork)


def run(setting: Setting, policies: tuple[str, ...], models: list[ModelProfile]) -> Results:
    names = tuple(m.model for m in models)
    sweep = setting.sweep()
    results = {}
    for clients, outstanding in MIXES:
        parts = [Part("latency", sweep, names[:6])]
        if clients:
            parts.append(Part("batch", ClosedLoop(clients, outstanding), names[6 : 6 + clients],
                              slo_ns=setting.batch_slo_ns))  # fmt: skip
        config = SimulationConfig(duration_ns=s_to_ns(setting.step_s * setting.steps), devices=6, seed=1)
        results[(clients, outstanding)] = side_by_side(policies, models, Composition(parts), config)
        if clients:
            alone = side_by_side(["clockwork"], models, Composition(parts[1:]), config)["clockwork"]
            results[(clients, outstanding)][BATCH_ONLY] = alone
    return results


def per_step(result: SimulationResult, step_s: float) -> dict[str, dict[int, tuple[int, int]]]:
    """Per class, per step of the sweep: (requests, good)."""
    counts: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for row in result.recorder.requests:
        label = result.labels.get(row.request_id, "")
        cell = counts[label][row.arrival_ns // s_to_ns(step_s)]
        cell[0] += 1
        cell[1] += row.good
    return {label: {step: (n, good) for step, (n, good) in steps.items()} for label, steps in counts.items()}


def bound(profile: ModelProfile, slo_ns: int) -> str:
    """The largest batch after which a batch of one still ends within ``slo_ns``."""
    one = profile.exec_time_ns(1)
    fitting = [b for b in sorted(profile.exec_ns) if profile.exec_ns[b] + one <= slo_ns]
    return f"{max(fitting)}" if fitting else "none"


def busy_share(result: SimulationResult, step_s: float, devices: int = 6) -> dict[int, float]:
    """Per step, the share of the devices' time spent on inference."""
    busy: dict[int, int] = defaultdict(int)
    for action in result.recorder.actions:
        if action.kind == "infer" and action.begin_ns >= 0:
            busy[action.begin_ns // s_to_ns(step_s)] += action.end_ns - action.begin_ns
    return {step: ns / (devices * s_to_ns(step_s)) for step, ns in busy.items()}


def step_tables(setting: Setting, results: Results, profile: ModelProfile) -> tuple[str, str]:
    """Per step: the latency-sensitive class's attainment per policy and mix; then the batch goodput per
    policy and mix beside the capacity the devices have left (the batch clients' goodput with the devices
    to themselves, times the share of the devices the class alone leaves idle)."""
    policies = [p for p in STEP_POLICIES if p in results[MIXES[0]]] or list(results[MIXES[0]])[:1]
    steps = {key: {p: per_step(r, setting.step_s) for p, r in by_policy.items()} for key, by_policy in results.items()}
    reference = "clockwork" if "clockwork" in results[MIXES[0]] else policies[0]
    idle = busy_share(results[MIXES[0]][reference], setting.step_s)
    header = ["step", "SLO", "bound"] + [f"{p} {mix}" for p in policies for mix in ("alone", "12 x 16", "48 x 4")]
    batch_header = ["step"]
    for mix in MIXES[1:]:
        batch_header += [f"capacity left {mix[0]} x {mix[1]}"] + [f"{p} {mix[0]} x {mix[1]}" for p in policies]
    rows, batch_rows = [], []
    sweep = setting.sweep()
    for step in range(setting.steps):
        factor = sweep.factor_at(step * s_to_ns(setting.step_s))
        slo = sweep.slo_ns_at(step * s_to_ns(setting.step_s), profile)
        row: list[object] = [step, f"{factor:.3g}x ({ns_to_ms(slo):.1f} ms)", bound(profile, slo)]
        for policy in policies:
            for mix in MIXES:
                n, good = steps[mix][policy].get("latency", {}).get(step, (0, 0))
                row.append(f"{good / n:.2%}" if n else "-")
        rows.append(row)
        batch_row: list[object] = [step]
        for mix in MIXES[1:]:
            _, alone_good = steps[mix][BATCH_ONLY].get("batch", {}).get(step, (0, 0))
            capacity = alone_good / setting.step_s * max(0.0, 1.0 - idle.get(step, 0.0))
            batch_row.append(f"{capacity:.0f}")
            for policy in policies:
                _, good = steps[mix][policy].get("batch", {}).get(step, (0, 0))
                rps = good / setting.step_s
                batch_row.append(f"{rps:.0f} ({rps / capacity:.0%})" if capacity else f"{rps:.0f}")
        batch_rows.append(batch_row)
    return markdown_table(header, rows), markdown_table(batch_header, batch_rows)


def totals_table(results: Results) -> str:
    rows = []
    for (clients, outstanding), by_policy in results.items():
        for policy, r in by_policy.items():
            if policy == BATCH_ONLY:
                continue
            by_label = r.report.by_label
            batch = by_label.get("batch")
            rows.append([
                f"{clients} x {outstanding}" if clients else "none",
                policy,
                f"{by_label['latency']['slo_attainment']:.3%}",
                f"{by_label['latency']['goodput_rps']:.0f}",
                "-" if batch is None else f"{batch['slo_attainment']:.2%}",
                "-" if batch is None else f"{batch['goodput_rps']:.0f}",
            ])  # fmt: skip
    header = ["batch clients", "policy", "latency attainment", "latency goodput", "batch attainment", "batch goodput"]
    return markdown_table(header, rows)


def main() -> None:
    p = parser(__doc__, POLICIES)
    p.add_argument("--duration-s", type=float, default=60.0, help="our setting: 10 steps over this long")
    p.add_argument("--step-s", type=float, default=5.0, help="the authors' setting: each step (theirs: 30 s)")
    add_slo_unit(p)
    args = p.parse_args()
    policies = tuple(policies_from(args.policy))
    duration = 5.0 if args.quick else args.duration_s
    step_s = 0.5 if args.quick else args.step_s
    models = resnet50_copies(6 + 48)
    ours = Setting("ours", FixedRate(200), 2.0, 10, duration / 10, ms_to_ns(1000))
    unit = slo_unit(args.slo_unit_ms)
    authors = Setting("the authors'", PoissonOpenLoop(200), 1.0, 12, step_s, s_to_ns(86_400), unit)
    ours_results = run(ours, policies, models)
    step_policies = tuple(p for p in policies if p in STEP_POLICIES) or policies[:1]
    authors_results = run(authors, step_policies, models)
    ours_steps, ours_batch = step_tables(ours, ours_results, models[0])
    authors_steps, authors_batch = step_tables(authors, authors_results, models[0])
    tables = [
        totals_table(ours_results),
        f"Per step, ours ({ours.describe()}): the latency-sensitive class's attainment,",
        ours_steps,
        "and the batch goodput (r/s; share of the capacity left):",
        ours_batch,
        f"Per step, the authors' setting ({authors.describe()}; their steps are 30 s):",
        authors_steps,
        "and the batch goodput (r/s; share of the capacity left):",
        authors_batch,
    ]
    plot([(ours, ours_results), (authors, authors_results)])
    write_section(
        "fig8",
        "Fig. 8: isolation of latency-sensitive models from batch clients (6 devices)",
        "**The authors'** (`sec64_fig8`): 6 latency-sensitive resnet50_v2 copies, Poisson at 200 r/s in all (their "
        "README says per model; their code divides by the copies), SLO from 1x the batch-1 time by x1.5 every "
        "30 s, beside no batch clients, 12 closed loops of 16 or 48 of 4 on their own copies with a one-day SLO, "
        "6 V100s, INFER5 with schedule-ahead 5 ms. "
        "**Ours** (first table): 6 latency-sensitive resnet50_v2 copies at a fixed 200 r/s each, SLO growing "
        f"from 2x the batch-1 time (6.6 ms) by x1.5 every {duration / 10:g} s; batch clients on their own "
        f"copies with a 1000 ms SLO; {duration:g} s. `bound`: the largest batch of the batch model after which a "
        "batch of one still ends within the SLO on that device (below).",
        "\n\n".join(tables),
        NOTES,
    )


def plot(settings: list[tuple[Setting, Results]]) -> None:
    """The latency-sensitive class's attainment per step, one panel per setting (``out/paper/fig8.png``)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4), sharey=True)
    for axis, (setting, results) in zip(axes, settings, strict=True):
        policies = [p for p in STEP_POLICIES if p in results[MIXES[0]]] or list(results[MIXES[0]])[:1]
        for policy in policies:
            for mix, style in zip(MIXES, ("-", "--", ":"), strict=True):
                steps = per_step(results[mix][policy], setting.step_s).get("latency", {})
                xs = sorted(steps)
                shares = [steps[x][1] / steps[x][0] if steps[x][0] else float("nan") for x in xs]
                label = f"{policy}, " + (f"{mix[0]} x {mix[1]}" if mix[0] else "alone")
                axis.plot(xs, shares, linestyle=style, marker=".", label=label)
        axis.set_title(f"Fig. 8, {setting.name} setting")
        unit = "the batch-1 time" if setting.unit_ms is None else f"{setting.unit_ms:g} ms"
        axis.set_xlabel(f"SLO step (x1.5 from {setting.start_factor:g}x {unit})")
        axis.legend(fontsize=6)
    axes[0].set_ylabel("latency-sensitive within SLO")
    save_plot(fig, "fig8")


if __name__ == "__main__":
    main()
