"""What preemption at fragment boundaries would buy Fig. 8's tight steps (a measurement, not a feature).

Nexus (SOSP'19) runs a DNN in fragments with scheduling between them; SHEPHERD preempts batches.
Here the batch model's inference is cut into K fragments with a scheduling point between each: its
profile's times are divided by K (no cost per fragment is charged, so this is the most it could
buy), and each batch request stands for 1/K of a request (its goodput is divided by K). A tight
request then waits for one fragment, not a whole batch. Fig. 8 in the authors' setting at fixed
SLO steps, 12 x 16 batch clients, with the guard off (plain least-slack batches, as Clockwork)
for K = 1, 2, 4, 8, and the guard on (``guard.py``) with K = 1 (what the policy does now) and K = 4.

    .venv/bin/python benchmarks/paper/fragments.py [--duration-s 8] [--quick]
"""

from __future__ import annotations

from common import markdown_table, parser, resnet50_copies, write_section

from mainspring.models.profile import ModelProfile
from mainspring.sim.run import SimulationConfig, SimulationResult, generate_arrivals, simulate
from mainspring.time import ns_to_ms, s_to_ns
from mainspring.workload import ClosedLoop, Composition, Part, PoissonOpenLoop

FACTORS = (1.5, 2.25, 3.375, 5.0625)  # the authors' steps 1-4 (from 1x by x1.5)
FRAGMENTS = (1, 2, 4, 8)
WARMUP_S = 2.0


def fragmented(profile: ModelProfile, k: int) -> ModelProfile:
    exec_ns = {b: max(1, t // k) for b, t in profile.exec_ns.items()}
    return ModelProfile(
        profile.model, profile.device_kind, profile.weights_bytes, profile.load_ns, exec_ns, profile.tensor_bytes
    )


def run(
    factor: float, k: int, guard: bool, duration_s: float, tight: bool = True, batch: bool = True
) -> SimulationResult:
    base = resnet50_copies(6 + 12)
    models = base[:6] + [fragmented(m, k) for m in base[6:]]
    names = tuple(m.model for m in models)
    parts = [Part("batch", ClosedLoop(12, 16), names[6:], slo_ns=s_to_ns(86_400))] if batch else []
    if tight:
        slo = base[0].slo_ns_for_factor(factor)
        parts.insert(0, Part("latency", PoissonOpenLoop(200), names[:6], slo_ns=slo))
    config = SimulationConfig(
        duration_ns=s_to_ns(duration_s - WARMUP_S), warmup_ns=s_to_ns(WARMUP_S), devices=6, seed=1
    )
    workload = Composition(parts)
    arrivals = generate_arrivals(workload, models, config)
    return simulate("clockwork", models, workload, config, arrivals, settings={"guard_tight": guard})


def measured(result: SimulationResult, k: int) -> tuple[float, float]:
    """After the warm-up: the tight class's attainment, and the batch goodput in whole requests a second."""
    by_label = result.report.by_label
    tight = by_label["latency"]["slo_attainment"] if "latency" in by_label else float("nan")
    return tight, by_label.get("batch", {}).get("goodput_rps", 0.0) / k


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--duration-s", type=float, default=8.0)
    args = p.parse_args()
    duration = 3.0 if args.quick else args.duration_s
    profile = resnet50_copies(1)[0]
    alone = {f: measured(run(f, 1, True, duration, batch=False), 1)[0] for f in FACTORS}
    capacity = measured(run(1.0, 1, False, duration, tight=False), 1)[1]
    runs = [(k, False) for k in FRAGMENTS] + [(1, True), (4, True)]
    header = ["SLO", "alone"] + [f"K={k}, guard {'on' if guard else 'off'}" for k, guard in runs]
    rows = []
    for factor in FACTORS:
        row: list[object] = [
            f"{factor:g}x ({ns_to_ms(profile.slo_ns_for_factor(factor)):.1f} ms)",
            f"{alone[factor]:.2%}",
        ]
        for k, guard in runs:
            share, rps = measured(run(factor, k, guard, duration), k)
            row.append(f"{share:.2%} / {rps:.0f}")
            print(f"{factor}x K={k} guard={guard}: {share:.2%} {rps:.0f} r/s", flush=True)
        rows.append(row)
    fragment_ms = ", ".join(f"K={k} {ns_to_ms(profile.exec_ns[16]) / k:.1f} ms" for k in FRAGMENTS)
    write_section(
        "fragments",
        "Preemption at fragment boundaries: what it would buy Fig. 8 (a measurement)",
        f"Fig. 8 in the authors' setting (6 devices, 6 resnet50_v2 at 200 r/s in all, Poisson, 12 x 16 batch "
        f"clients with a one-day SLO) at fixed SLO steps, {duration:g} s each, counted after {WARMUP_S:g} s. The "
        f"batch model's inference is cut into K fragments with a scheduling point between each (a 16-batch: "
        f"{fragment_ms}), charged nothing per fragment, so this is the most fragments could buy. Cells: the "
        f"latency-sensitive class's attainment / the batch goodput in whole requests a second (with the devices "
        f"to itself: {capacity:.0f} r/s).",
        markdown_table(header, rows),
        "Reading: without the guard, fragments protect the class only once they are short against its SLO "
        "(at 11.2 ms even 8 fragments of 2.7 ms leave it short of 99.5%); the guard holds it from 11.2 ms on "
        "without preemption by keeping a few devices responsive and cutting the batches there. What fragments "
        "add beside the guard is batch goodput on those devices, where whole batches could then run in pieces: "
        "the last column against the guard alone. That gain, not the class's attainment, is what an issue for "
        "preemption would buy.",
    )


if __name__ == "__main__":
    main()
