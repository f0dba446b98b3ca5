"""A steady model beside a flood of new ones, on one device: Fig. 6's shape on settings the paper does not have.

``--steady`` models (each at ``--steady-rps``, Poisson) run alone for a lead-in; then ``--majors`` copies
share ``--major-rps`` (Poisson), ``--burst`` more becoming active every ``--burst`` seconds (1: Fig. 6's
one a second). The pool holds ``--fit`` copies, so once that many are active every load evicts. Printed
per policy or variant (``--variant NAME:KEY=VALUE,...`` runs clockwork with those settings): the steady
models' attainment through the first minute of majors, from the first eviction on, and overall; the
majors' attainment and the goodput. Fig. 6 itself is ``benchmarks/paper/fig6.py``.

    .venv/bin/python benchmarks/steady_beside_flood.py [--model resnet50_v2] [--steady 1] [--burst 1] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.sim.run import SimulationConfig, SimulationResult, generate_arrivals, simulate
from mainspring.time import NS_PER_S, s_to_ns
from mainspring.workload import Composition, Part, ProgressiveActivation
from mainspring.workload.generators import PoissonOpenLoop


@dataclass
class BurstActivation(ProgressiveActivation):
    """``ProgressiveActivation`` whose models become active ``burst`` at a time (``interval_s`` apart)."""

    burst: int = 1

    def active_at(self, time_ns: int, n_models: int) -> int:
        since = time_ns - int(self.start_s * NS_PER_S)
        if since < 0:
            return 0
        return min(n_models, self.initial + self.burst * int(since // (self.interval_s * NS_PER_S)))


def attainment(rows: list[bool]) -> str:
    return f"{sum(rows) / len(rows):.3%}" if rows else "-"


def summary(result: SimulationResult, lead_in_s: float) -> list[str]:
    full = [a.begin_ns for a in result.recorder.actions if a.kind == "evict" and a.status == "ok"]
    full_ns = min(full) if full else None
    start, minute = s_to_ns(lead_in_s), s_to_ns(lead_in_s + 60)
    steady_rows = [r for r in result.recorder.requests if result.labels.get(r.request_id) == "steady"]
    first = [r.good for r in steady_rows if start <= r.arrival_ns < minute]
    after = [r.good for r in steady_rows if full_ns is not None and r.arrival_ns >= full_ns]
    rep = result.report
    return [
        attainment(first),
        attainment(after) if full_ns is not None else "never full",
        f"{rep.by_label['steady']['slo_attainment']:.3%}",
        f"{rep.by_label['major']['slo_attainment']:.3%}",
        f"{rep.goodput_rps:.0f}",
    ]


def series(result: SimulationResult, bucket_s: float) -> None:
    """Per bucket: each class's attainment, the exec lane's busy share, and the majors' outcomes."""
    bucket_ns = s_to_ns(bucket_s)
    rows: dict[int, dict[str, int]] = {}
    for a in result.recorder.actions:
        if a.kind == "infer" and a.status == "ok":
            row = rows.setdefault(a.begin_ns // bucket_ns, {})
            row["exec"] = row.get("exec", 0) + a.end_ns - a.begin_ns
    for r in result.recorder.requests:
        row = rows.setdefault(r.arrival_ns // bucket_ns, {})
        label = result.labels.get(r.request_id, "")
        for key in (label, f"{label} good" if r.good else "", f"{label} {r.outcome}" if not r.good else ""):
            if key:
                row[key] = row.get(key, 0) + 1
    for index in sorted(rows):
        row = rows[index]
        cells = [f"{index * bucket_s:g}s", f"exec {row.get('exec', 0) / bucket_ns:.0%}"]
        for label in ("steady", "major"):
            if row.get(label):
                cells.append(f"{label} {row.get(label + ' good', 0) / row[label]:.2%}")
        cells += [f"{k}={v}" for k, v in sorted(row.items()) if k.count(" ") and "good" not in k]
        print("  ", " ".join(cells))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="clockwork,infer5")
    p.add_argument("--variant", action="append", default=[], help="NAME:KEY=VALUE,... (clockwork with settings)")
    p.add_argument("--model", default="resnet50_v2")
    p.add_argument("--steady", type=int, default=1)
    p.add_argument("--steady-rps", type=float, default=200.0)
    p.add_argument("--majors", type=int, default=3600)
    p.add_argument("--major-rps", type=float, default=1000.0)
    p.add_argument("--burst", type=int, default=1, help="majors activated at once, this many seconds apart")
    p.add_argument("--fit", type=int, default=201, help="copies the pool holds")
    p.add_argument("--slo-ms", type=float, default=100.0)
    p.add_argument("--lead-in-s", type=float, default=20.0)
    p.add_argument("--duration-s", type=float, default=320.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--series-s", type=float, default=0.0, help="also print each run over time, in buckets this long")
    args = p.parse_args()
    [profile] = [m for m in builtin_profiles() if m.model == args.model]
    models = model_copies([profile], args.steady + args.majors)
    names = tuple(m.model for m in models)
    majors = BurstActivation(args.major_rps, initial=args.burst, interval_s=float(args.burst),
                             start_s=args.lead_in_s, burst=args.burst)  # fmt: skip
    workload = Composition(
        [
            Part("steady", PoissonOpenLoop(args.steady_rps), names[: args.steady]),
            Part("major", majors, names[args.steady :]),
        ]
    )
    page_bytes = SimulationConfig(duration_ns=1).page_bytes
    pool = args.fit * math.ceil(profile.weights_bytes / page_bytes) * page_bytes
    config = SimulationConfig(duration_ns=s_to_ns(args.duration_s), devices=1, pool_bytes=pool, seed=args.seed,
                              slo_ns=s_to_ns(args.slo_ms / 1000))  # fmt: skip
    arrivals = generate_arrivals(workload, models, config)
    runs: list[tuple[str, str, dict[str, object] | None]] = [(n, n, None) for n in args.policy.split(",") if n]
    for text in args.variant:
        name, _, pairs = text.partition(":")
        changed: dict[str, object] = dict(pair.split("=", 1) for pair in pairs.split(",") if pair)
        runs.append((name, "clockwork", changed))
    print(f"# {args.model}, {args.steady} steady at {args.steady_rps:g} r/s, majors {args.major_rps:g} r/s "
          f"+{args.burst} per {args.burst} s, fit {args.fit}, SLO {args.slo_ms:g} ms, {args.duration_s:g} s, "
          f"seed {args.seed}")  # fmt: skip
    print("| run | steady, first minute | steady once full | steady | major | goodput r/s |")
    print("|---|---|---|---|---|---|")
    for name, policy, settings in runs:
        result = simulate(policy, models, workload, config, arrivals, settings=settings)
        print("| " + " | ".join([name, *summary(result, args.lead_in_s)]) + " |", flush=True)
        if args.series_s:
            series(result, args.series_s)


if __name__ == "__main__":
    main()
