"""Each departure of ``clockwork`` from INFER4, switched off one at a time, on the scenarios where
they matter: Fig. 5 saturation (100 and 25 ms), open-loop overload at 1.5x over 15 and 3 models,
the isolation burst, and the Azure burst window (x30 from minute 0; misses summed over seeds, since
where one burst's requests fall against the noise model's spikes moves a single seed's count tenfold).

    .venv/bin/python benchmarks/paper/ablation.py [--azure-s 300] [--azure-seeds 1 2 3] [--only LABEL ...]
"""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from common import markdown_table, parser, resnet50_copies

from mainspring.models.profile import ModelProfile, builtin_profiles, model_copies
from mainspring.protocol import DeviceSpec
from mainspring.scheduler import registry
from mainspring.scheduler.base import Scheduler
from mainspring.scheduler.clockwork import ClockworkConfig, ClockworkScheduler
from mainspring.sim.run import SimulationConfig, generate_arrivals, simulate
from mainspring.time import NS_PER_S, ms_to_ns, s_to_ns
from mainspring.workload import AzureTrace, ClosedLoop, PoissonOpenLoop, Workload

VARIANTS: dict[str, dict[str, object]] = {
    "clockwork (defaults)": {},
    "without whole_batches": {"whole_batches": False},
    "without lookahead": {"lookahead": False},
    "lookahead for every model": {"lookahead_within_share": False},
    "without share_admission": {"share_admission": False},
    "without share_full_batch": {"share_full_batch": False},
    "without queue_demand": {"queue_demand": False},
    "with device_admission": {"device_admission": True},
    "without demand_counts_rejected": {"demand_counts_rejected": False},
    "without start_early": {"start_early": False},
    "without monotone_estimates": {"monotone_estimates": False},
    "without efficient_when_contended": {"efficient_when_contended": False},
    "without split_padding": {"split_padding": False},
    "without share_protects_only": {"share_protects_only": False},
    "without spill_after": {"spill_after": None},
    "without probe_after_ms": {"probe_after_ms": None},
    "without evict_by_popularity": {"evict_by_popularity": False},
    "without gather_max_ms": {"gather_max_ms": None},
    "before (none of the four)": {
        "whole_batches": False,
        "lookahead_within_share": False,
        "share_full_batch": False,
        "efficient_when_contended": False,
    },
}


def register() -> list[str]:
    names = []
    for i, settings in enumerate(VARIANTS.values()):
        config = ClockworkConfig(**settings)  # type: ignore[arg-type]

        def factory(
            profiles: Mapping[str, ModelProfile],
            devices: Sequence[DeviceSpec],
            rng: random.Random,
            margin_ns: int,
            config: ClockworkConfig = config,
        ) -> Scheduler:
            return ClockworkScheduler(profiles, devices, config, rng)

        name = f"variant{i}"
        registry._FACTORIES[name] = factory  # benchmark-only names; never listed to users
        names.append(name)
    return [*names, "infer4"]


def goodput_share(policy: str, models: list[ModelProfile], workload: Workload, config: SimulationConfig) -> str:
    limit = 16 / (models[0].exec_ns[16] / 1e9)
    return f"{simulate(policy, models, workload, config).report.goodput_rps / limit:.1%}"


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--azure-s", type=float, default=300.0)
    p.add_argument("--azure-seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--only", nargs="+", metavar="LABEL", help="rows to run (variant labels, infer4); default all")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.scheduler.test_isolation import MODELS as BURST_MODELS
    from tests.scheduler.test_isolation import burst_workload

    policies = register()
    fig5 = resnet50_copies(15)
    azure_models = model_copies(builtin_profiles(), 4026)
    azure = AzureTrace(scale=30.0, start_minute=0)
    azure_runs = []
    for seed in args.azure_seeds:
        azure_config = SimulationConfig(duration_ns=s_to_ns(args.azure_s), devices=6, seed=seed)
        azure_runs.append((azure_config, generate_arrivals(azure, azure_models, azure_config)))
    rows = []
    for label, policy in zip([*VARIANTS, "infer4"], policies, strict=True):
        if args.only and label not in args.only:
            continue
        row = [label]
        for slo_ms, seconds in ((100, 20), (25, 10)):
            config = SimulationConfig(duration_ns=s_to_ns(seconds), devices=1, slo_ns=ms_to_ns(slo_ms), seed=1)
            row.append(goodput_share(policy, fig5, ClosedLoop(240), config))
        for n in (15, 3):
            models = resnet50_copies(n)
            limit = 16 / (models[0].exec_ns[16] / 1e9)
            config = SimulationConfig(duration_ns=s_to_ns(10), devices=1, seed=1)
            row.append(goodput_share(policy, models, PoissonOpenLoop(1.5 * limit), config))
        burst = SimulationConfig(
            duration_ns=3 * NS_PER_S, devices=1, pool_bytes=64 * 16 * 2**20, page_bytes=16 * 2**20, seed=2
        )
        steady = [
            r for r in simulate(policy, BURST_MODELS, burst_workload(), burst).recorder.requests if r.model == "steady"
        ]
        row.append(f"{sum(r.good for r in steady) / len(steady):.2%}")
        misses = 0
        for azure_config, arrivals in azure_runs:
            report = simulate(policy, azure_models, azure, azure_config, arrivals).report
            misses += report.requests - round(report.slo_attainment * report.requests)
        row.append(misses)
        rows.append(row)
        print(" | ".join(str(c) for c in row), flush=True)
    print(
        markdown_table(
            [
                "variant",
                "Fig. 5 100 ms",
                "Fig. 5 25 ms",
                "open 1.5x, 15",
                "open 1.5x, 3",
                "steady beside burst",
                f"Azure x30 misses (seeds {', '.join(map(str, args.azure_seeds))})",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
