"""Fig. 6: cold starts at scale. One device; a "minor" model at 200 r/s plus 3,600 "major" models
sharing 1,000 r/s, one more major model becoming active every second.

Per policy: attainment of each class, cold starts, loads; over time (per minute): cold starts,
load-lane and exec-lane busy. Aim: the minor model unaffected while the majors churn memory.

    .venv/bin/python benchmarks/paper/fig6.py [--duration-s 600] [--quick]
"""

from __future__ import annotations

from common import OUT, copies, markdown_table, parser, side_by_side, write_section

from mainspring.scheduler.registry import parse_policies
from mainspring.sim.run import SimulationConfig, SimulationResult
from mainspring.time import NS_PER_S, s_to_ns
from mainspring.workload import Composition, FixedRate, Part, ProgressiveActivation


def over_time(result: SimulationResult, bucket_s: float, duration_s: float) -> list[tuple[float, int, float, float]]:
    """(minute, cold starts, load-lane busy, exec-lane busy) per bucket."""
    bucket_ns = int(bucket_s * NS_PER_S)
    n = max(1, int(duration_s // bucket_s))
    cold, load, exec_ = [0] * n, [0] * n, [0] * n
    for row in result.recorder.requests:
        if row.cold and row.arrival_ns // bucket_ns < n:
            cold[row.arrival_ns // bucket_ns] += 1
    for a in result.recorder.actions:
        if a.status != "ok" or a.begin_ns // bucket_ns >= n:
            continue
        target = load if a.kind == "load" else exec_ if a.kind == "infer" else None
        if target is not None:
            target[a.begin_ns // bucket_ns] += a.end_ns - a.begin_ns
    return [(i * bucket_s, cold[i], load[i] / bucket_ns, exec_[i] / bucket_ns) for i in range(n)]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--duration-s", type=float, default=600.0)
    args = p.parse_args()
    duration = 20.0 if args.quick else args.duration_s
    policies = parse_policies(args.policy)
    models = copies("resnet18_v2", 3601)
    names = tuple(m.model for m in models)
    workload = Composition(
        [
            Part("minor", FixedRate(200), names[:1]),
            Part("major", ProgressiveActivation(1000, initial=1, interval_s=1.0), names[1:]),
        ]
    )
    config = SimulationConfig(duration_ns=s_to_ns(duration), devices=1, seed=1)
    results = side_by_side(policies, models, workload, config)
    rows = []
    for policy, r in results.items():
        rep = r.report
        rows.append(
            [
                policy,
                f"{rep.by_label['minor']['slo_attainment']:.3%}",
                f"{rep.by_label['major']['slo_attainment']:.3%}",
                f"{rep.goodput_rps:.0f}",
                rep.cold_starts,
                f"{rep.loads} / {rep.evictions}",
            ]
        )
    bucket = max(duration / 10, 1.0)
    series = over_time(results[policies[0]], bucket, duration)
    series_rows = [[f"{t:.0f}", c, f"{lb:.1%}", f"{eb:.1%}"] for t, c, lb, eb in series]
    plot(results, bucket, duration)
    write_section(
        "fig6",
        "Fig. 6: cold starts at scale (one device, a minor model and 3,600 major models)",
        f"One emulated V100 (32 GiB: about 680 resnet18_v2 fit); the minor model at a fixed 200 r/s, 3,600 major "
        f"models sharing 1,000 r/s (Poisson), one more active every second; {duration:g} s; 100 ms SLO.",
        markdown_table(
            ["policy", "minor attainment", "major attainment", "goodput r/s", "cold starts", "loads / evictions"], rows
        )
        + f"\n\nOver time ({policies[0]}; from second, per {bucket:g} s):\n\n"
        + markdown_table(["from s", "cold starts", "load lane busy", "exec lane busy"], series_rows),
        "The paper plots cold starts and PCIe and GPU busy over time without a table.",
    )


def plot(results: dict[str, SimulationResult], bucket: float, duration: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for policy, r in results.items():
        series = over_time(r, bucket, duration)
        axes[0].plot([s[0] for s in series], [s[1] for s in series], label=policy)
        axes[1].plot([s[0] for s in series], [s[2] for s in series], label=f"{policy} load lane")
    axes[0].set_ylabel("cold starts")
    axes[1].set_ylabel("load lane busy")
    axes[1].set_xlabel("time (s)")
    axes[0].legend(fontsize=7)
    OUT.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT / "fig6.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
