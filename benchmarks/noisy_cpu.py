"""One noisy CPU device, simulated, on workloads beyond the closed loop it was tuned on.

The setting of ``closed_loop_noise.py`` (resnet18 64x64's batch times on this CPU in a quiet
process, log-normal jitter sigma 0.15 and 5% of runs 1.5-3.5x slower, as on a CPU that shares its
cores): closed loops of 8 and 16 clients at two SLOs, Poisson at 70, 94 and 140 r/s (about 35 /
50 / 70% of what batches of eight serve) at SLOs of 102 and 60 ms, bursts at 3x that (S2 of
``scenarios.py``), and 30 copies of the model in a
pool that holds 10 (Zipf, 20 / 40 / 60 r/s, SLO 100 ms: S3 of ``scenarios.py``). Attainment and
goodput per seed. Run it for two checkouts to compare a change:

    .venv/bin/python benchmarks/noisy_cpu.py [--policy clockwork] [--seeds 1 2 3] [--duration-s 30]
    .venv/bin/python benchmarks/noisy_cpu.py --set admission_percentile_cpu=50   # a policy setting
    PYTHONPATH=<another checkout>/src .venv/bin/python benchmarks/noisy_cpu.py
"""

from __future__ import annotations

import argparse

from closed_loop_noise import CPU_RESNET18, SHARED_CPU_NOISE
from mainspring.models.profile import ModelProfile, model_copies
from mainspring.protocol import CPU_KIND
from mainspring.settings import key_values
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import BurstyOnOff, ClosedLoop, PoissonOpenLoop, Workload

POOL_FOR_TEN = 10 * 47 * 2**20  # about ten resnet18s (46.8 MB each)


def scenarios() -> list[tuple[str, list[ModelProfile], Workload, float, int | None]]:
    """(label, models, workload, SLO in ms, pool bytes or None for the default)."""
    one = [CPU_RESNET18]
    many = model_copies([CPU_RESNET18], 30)
    return [
        ("closed loop, 16 clients, SLO 102 ms", one, ClosedLoop(16), 102, None),
        ("closed loop, 8 clients, SLO 102 ms", one, ClosedLoop(8), 102, None),
        ("closed loop, 16 clients, SLO 150 ms", one, ClosedLoop(16), 150, None),
        ("Poisson 70 r/s, SLO 102 ms", one, PoissonOpenLoop(70.0), 102, None),
        ("Poisson 94 r/s, SLO 102 ms", one, PoissonOpenLoop(94.0), 102, None),
        ("Poisson 140 r/s, SLO 102 ms", one, PoissonOpenLoop(140.0), 102, None),
        ("Poisson 94 r/s, SLO 60 ms", one, PoissonOpenLoop(94.0), 60, None),
        ("bursts at 3x (1 s on, 4 s off), SLO 102 ms", one, BurstyOnOff(3 * 198.0), 102, None),
        *[
            (
                f"30 models, pool for 10, Zipf {rate:g} r/s",
                many,
                PoissonOpenLoop(rate, popularity="zipf"),
                100,
                POOL_FOR_TEN,
            )
            for rate in (20.0, 40.0, 60.0)
        ],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="clockwork")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--set", nargs="*", default=[], help="policy settings, e.g. admission_percentile_cpu=50")
    args = parser.parse_args()
    settings = key_values(args.set, "--set") or None  # strings: the policy's config converts them (true, none)
    policy = ", ".join([args.policy, *args.set])
    print(f"{policy} on one noisy {CPU_KIND} device, {args.duration_s:g} s; attainment (goodput r/s) per seed")
    for label, models, workload, slo_ms, pool in scenarios():
        cells = []
        for seed in args.seeds:
            config = SimulationConfig(
                duration_ns=s_to_ns(args.duration_s),
                devices=1,
                device_kind=CPU_KIND,
                slo_ns=ms_to_ns(slo_ms),
                seed=seed,
                noise=SHARED_CPU_NOISE,
                **({} if pool is None else {"pool_bytes": pool}),
            )
            report = simulate(args.policy, models, workload, config, settings=settings).report
            cells.append(f"{report.slo_attainment:7.2%} ({report.goodput_rps:5.1f})")
        print(f"{label:42} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
