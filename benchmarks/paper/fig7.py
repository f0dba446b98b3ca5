"""Fig. 7: goodput as the SLO grows. 6 devices, 12 or 48 resnet50_v2 copies, 600 / 1,200 / 2,400 r/s;
the SLO starts at 1x (2.9 ms, the authors' unit; ``--slo-unit-ms 0``: the profile's batch-1 time, 3.32 ms)
and grows x1.5 every step up to 100x.

Goodput per SLO step per policy. Aim: clockwork at or above the best baseline at every SLO.

    .venv/bin/python benchmarks/paper/fig7.py [--step-s 10] [--slo-unit-ms 2.9] [--quick]
"""

from __future__ import annotations

import math

from common import (
    PROFILE_SLO_UNIT_MS,
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

from mainspring.sim.run import SimulationConfig, SimulationResult
from mainspring.time import s_to_ns
from mainspring.workload import PoissonOpenLoop, SloSweep


def main() -> None:
    p = parser(__doc__, POLICIES)
    p.add_argument("--step-s", type=float, default=10.0, help="seconds per SLO step (the paper: 30)")
    add_slo_unit(p)
    args = p.parse_args()
    policies = policies_from(args.policy)
    unit = slo_unit(args.slo_unit_ms)
    unit_ms = unit or PROFILE_SLO_UNIT_MS
    step_s = 1.0 if args.quick else args.step_s
    steps = math.ceil(math.log(100) / math.log(1.5)) + 1  # 1x .. 100x
    sections = []
    curves: dict[str, dict[str, list[float]]] = {}  # per setting, per policy: goodput per step
    for n_models, rate in (
        [(12, 600), (48, 2400)] if args.quick else [(m, r) for m in (12, 48) for r in (600, 1200, 2400)]
    ):
        models = resnet50_copies(n_models)
        sweep = SloSweep(PoissonOpenLoop(rate), start_factor=1.0, growth=1.5, interval_s=step_s, unit_ms=unit)
        config = SimulationConfig(duration_ns=s_to_ns(step_s * steps), devices=6, seed=1)
        results = side_by_side(policies, models, sweep, config)
        step_ns = s_to_ns(step_s)
        rows = []
        wins = 0
        for step in range(steps):
            factor = sweep.factor_at(step * step_ns)
            goodput = {}
            for policy, r in results.items():
                good = sum(1 for row in r.recorder.requests if row.good and row.arrival_ns // step_ns == step)
                goodput[policy] = good / step_s
            baseline = max((g for q, g in goodput.items() if q in ("triton", "clipper")), default=0.0)
            wins += goodput.get("clockwork", 0.0) >= baseline
            rows.append([f"{factor:.3g}x ({factor * unit_ms:.1f} ms)", *(f"{goodput[q]:.0f}" for q in policies)])
            for q in policies:
                curves.setdefault(f"{n_models} models, {rate} r/s", {}).setdefault(q, []).append(goodput[q])
        title = f"{n_models} models, {rate} r/s (clockwork >= best baseline at {wins} of {steps} SLOs)"
        late = ", ".join(f"{q} {answered_late(r, step_ns):,}" for q, r in results.items())
        table = markdown_table(["SLO", *policies], rows)
        sections.append(f"**{title}**\n\n{table}\n\nAt 1x, served after their deadline: {late}.")
    past_slo = max(1.5**k for k in range(steps) if 1.5**k * unit_ms < 10)  # below INFER5-5ms's 10 ms floor
    write_section(
        "fig7",
        "Fig. 7: goodput (r/s) as the SLO grows (6 devices)",
        "**The authors'** (`sec63_fig7`): 12 or 48 resnet50_v2 copies on 6 V100s, Poisson at 600, 1,200 or "
        "2,400 r/s in all, the SLO from 1x the batch-1 time by x1.5 every 30 s past 86.5x, INFER5 with "
        "schedule-ahead 5 ms (batches of at most 8). **Ours:** the same models, rates and devices, emulated; the "
        f"SLO from 1x by x1.5 every {step_s:g} s to 100x; goodput of the requests that arrived during each step. "
        "**Differences:** steps of "
        f"{step_s:g} s against 30 s; "
        + ("1x is their 2.9 ms" if unit == 2.9 else f"1x is {unit_ms:g} ms here against their 2.9 ms")
        + " (`--slo-unit-ms`); one more step, at 100x. INFER5 "
        "keeps a deadline of at least its schedule-ahead plus a 5 ms buffer (10 ms with 5 ms), so at "
        f"1x-{past_slo:.3g}x it plans past the SLO, as theirs did. **Headline:** the paper plots this figure "
        "without a table "
        '(section 6.3, "How low can Clockwork go?"): Clockwork\'s goodput rises with the SLO above the '
        "baselines'. Per step: `out/paper/fig7.png`.",
        "\n\n".join(sections),
        NOTES,
    )
    plot(curves)


def plot(curves: dict[str, dict[str, list[float]]]) -> None:
    """Goodput per SLO step, one panel per setting (``out/paper/fig7.png``), as the paper's Fig. 7."""
    plt = pyplot()
    cols = min(3, len(curves))
    rows = -(-len(curves) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for axis, (setting, by_policy) in zip(axes.flat, curves.items(), strict=False):
        for policy, goodput in by_policy.items():
            axis.plot(range(len(goodput)), goodput, marker=".", label=policy)
        axis.set_title(setting)
        axis.set_xlabel("SLO step (1x the batch-1 time, x1.5 each)")
        axis.set_ylabel("goodput (r/s)")
    axes.flat[0].legend(fontsize=6)
    save_plot(fig, "fig7")


REPLICAS_BY_WAIT = (
    "A replica rule by wait closes this: with `replicas_by_wait` (off by default; "
    '`docs/scheduler/loads-and-evictions.md`, "Replicas by wait") a model whose holders turn away at '
    "least 2 requests a second that another device had a free lane for gets a replica in free memory, and"
    " clockwork is at or above INFER5-5ms at every step from 1.5x in all six settings (the authors'-unit "
    "table above, seed 1; at a fixed SLO on seed 3, 20 of 24 cells from 1.5x to 5.06x, the other four "
    "0.2-1.5% below). In the profile's unit (`--slo-unit-ms 0`, seed 1) it is at or above every column of"
    " the tables above in 71 of 72 cells from 1.5x (12 models at 1,200 r/s, 2.25x: 1,186 against INFER5's"
    " 1,188), and its clockwork column is reproduced exactly. It leaves the decision fingerprints of the "
    "default settings and six Azure windows (360/1, 1260/2, 900/3, 540/2: 0 misses, the same loads; "
    "1080/3, 180/1: 0 misses) as they were, and moves Fig. 8's totals in our setting by at most 0.07 "
    "points; Fig. 8's per-step aims, the other Azure windows and the held-out trace were not re-checked "
    "with it, so it is not the default yet."
)

NOTES = (
    "With the authors' unit (2.9 ms, the default) 1x is below the profile's batch-1 time (3.32 ms): no "
    "batch can make it, and every step is 14% tighter than in the profile's unit. The rest of this note was "
    "measured in the profile's unit (`--slo-unit-ms 0`). "
    "At 1x the SLO equals the profile's batch-1 time, so a batch of one makes it only when it starts the "
    "moment its request arrives and runs no slower than the profile: about half the runs on an idle lane."
    " Clockwork's estimate (the p99 of the last ten runs) is above the SLO, so it rejects at arrival; its"
    " late answers are one probe per model never measured (`probe_after_ms`). INFER4 never rejects at "
    "arrival and floors its scheduling deadline at 15 ms (schedule-ahead plus buffer), far past a 3.3 ms "
    "SLO: it runs nearly every request, and those that happen to finish in time are its goodput at 1x, "
    "the rest answered late; the reactive baselines queue and answer late as well. Serving on the chance "
    "that a run beats its p99 would trade that goodput for answers after the deadline, which is what "
    "clockwork exists to avoid; it is not done."
    "\n\nWhere the faithful port does better: at 2.25x and 3.38x (7.5 and 11.2 ms) INFER5 serves 3-15% more"
    " than clockwork (12 models at 1,200 r/s, 2.25x: 1,188 r/s against 1,031). At a fixed 2.25x for 10 s,"
    " clockwork rejects 14% at arrival and serves 86% in time; INFER5 serves 98.5% in time (1.5% late or "
    "timed out). Both run batches of one; the difference is where the models are: clockwork keeps each of"
    " the 12 models on one device (each device about two-thirds busy, so its replica rule, demand beyond "
    "what the holders serve, never fires), while INFER5's load tracker spreads every model over 3-6 "
    "devices, and a request goes to whichever frees first. " + REPLICAS_BY_WAIT
)


POLICIES = ("clockwork", "infer5-5ms", "infer4", "triton", "clipper")  # the authors ran INFER5, schedule-ahead 5 ms


def answered_late(result: SimulationResult, step_ns: int) -> int:
    """Requests of the first (1x) step answered SUCCESS after their deadline."""
    rows = result.recorder.requests
    return sum(1 for row in rows if row.arrival_ns < step_ns and row.status == "success" and not row.good)


if __name__ == "__main__":
    main()
