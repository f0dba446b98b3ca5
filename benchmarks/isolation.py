"""Isolation of a tight class from batch clients, guard on and off, in settings the paper has and does not.

A *tight* class (open-loop requests with an SLO a few times their batch-1 time) shares the devices
with closed-loop clients of a model with a long SLO (and, in one setting, with Azure trace traffic).
Each setting runs, on the identical arrivals:

- the tight class alone (with any background traffic), which gives its own attainment and the
  devices' busy share it takes;
- the batch clients alone, which gives the batch goodput the devices can give;
- both, with the guard off (``guard_tight=false``, every device runs the least-slack batch whole, as
  Clockwork does) and on (the default, ``scheduler/clockwork/guard.py``).

``capacity left`` is the batch clients' goodput alone times the share of the devices the tight
class leaves. The aims (issue 47): where the tight class alone reaches 99.9%, it reaches 99.5% with
the batch clients; the batch goodput is at least 80% of the capacity left. Settings marked
``tuned`` are the ones the guard's constants were chosen on (Fig. 8 in the authors' setting at its
steps 3 and 4); the others were written afterwards and not tuned on. Figures count from
``WARMUP_S`` on, once the first loads are done.

    .venv/bin/python benchmarks/isolation.py [--seeds 1,2] [--only NAME]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from mainspring.models.profile import ModelProfile, builtin_profiles, model_copies
from mainspring.sim.run import SimulationConfig, generate_arrivals, simulate
from mainspring.time import ms_to_ns, s_to_ns
from mainspring.workload import AzureTrace, ClosedLoop, Composition, Part, PoissonOpenLoop, Workload

WARMUP_S = 2.0
DAY_S = 86_400.0


def _copies(model: str, count: int, prefix: str) -> list[ModelProfile]:
    profile = next(p for p in builtin_profiles() if p.model == model)
    return [c.renamed(f"{prefix}-{c.model}") for c in model_copies([profile], count)]


@dataclass(frozen=True)
class Setting:
    name: str
    tuned: bool
    devices: int
    tight: tuple[str, int, Workload, float]  # model, copies, workload, SLO (ms)
    batch: list[tuple[str, int, int, float]]  # model, clients, outstanding each, SLO (s)
    background: tuple[str, int, Workload, float] | None = None  # model, copies, workload, SLO (ms)
    duration_s: float = 8.0
    notes: str = field(default="")


SETTINGS = [
    Setting(
        "fig8-authors-11ms-12x16",
        True,
        6,
        ("resnet50_v2", 6, PoissonOpenLoop(200), 11.205),
        [("resnet50_v2", 12, 16, DAY_S)],
    ),
    Setting(
        "fig8-authors-11ms-48x4",
        True,
        6,
        ("resnet50_v2", 6, PoissonOpenLoop(200), 11.205),
        [("resnet50_v2", 48, 4, DAY_S)],
    ),
    Setting(
        "fig8-authors-17ms-12x16",
        True,
        6,
        ("resnet50_v2", 6, PoissonOpenLoop(200), 16.807),
        [("resnet50_v2", 12, 16, DAY_S)],
    ),
    Setting(
        "small-20ms+azure+r152",
        False,
        6,
        ("resnet18_v2", 12, PoissonOpenLoop(600), 20.0),
        [("resnet152_v2", 4, 16, 10.0)],
        background=("resnet50_v2", 200, AzureTrace(scale=20, start_minute=600), 100.0),
        notes="the issue's example: a 20 ms class of small models beside trace traffic and a large model's clients",
    ),
    Setting(
        "r152-45ms+r152-8x16",
        False,
        6,
        ("resnet152_v2", 4, PoissonOpenLoop(150), 45.0),
        [("resnet152_v2", 8, 16, 60.0)],
    ),
    Setting(
        "r18-8ms+r50-24x8", False, 4, ("resnet18_v2", 6, PoissonOpenLoop(1000), 8.0), [("resnet50_v2", 24, 8, 1.0)]
    ),
    Setting(
        "r50-20ms-zipf+r50-6x16",
        False,
        12,
        ("resnet50_v2", 10, PoissonOpenLoop(400, "zipf"), 20.0),
        [("resnet50_v2", 6, 16, DAY_S)],
    ),
    Setting(
        "r50-15ms+r18-48x16", False, 3, ("resnet50_v2", 6, PoissonOpenLoop(100), 15.0), [("resnet18_v2", 48, 16, DAY_S)]
    ),
    Setting(
        "r18-10ms-zipf+mixed",
        False,
        8,
        ("resnet18_v2", 20, PoissonOpenLoop(800, "zipf"), 10.0),
        [("resnet152_v2", 3, 16, DAY_S), ("resnet50_v2", 12, 4, 30.0)],
    ),
]


@dataclass
class Outcome:
    tight: float  # attainment of the tight class
    batch_rps: float  # batch goodput
    busy: float  # share of the devices' time spent on inference


def _run(setting: Setting, with_tight: bool, with_batch: bool, guard: bool, seed: int) -> Outcome:
    models: list[ModelProfile] = []
    parts: list[Part] = []
    if with_tight:
        model, count, workload, slo_ms = setting.tight
        group = _copies(model, count, "tight")
        models += group
        parts.append(Part("tight", workload, tuple(m.model for m in group), slo_ns=ms_to_ns(slo_ms)))
        if setting.background is not None:
            model, count, workload, slo_ms = setting.background
            group = _copies(model, count, "trace")
            models += group
            parts.append(Part("trace", workload, tuple(m.model for m in group), slo_ns=ms_to_ns(slo_ms)))
    if with_batch:
        for i, (model, clients, outstanding, slo_s) in enumerate(setting.batch):
            group = _copies(model, clients, f"batch{i}")
            models += group
            part = Part(f"batch{i}", ClosedLoop(clients, outstanding), tuple(m.model for m in group), s_to_ns(slo_s))
            parts.append(part)
    config = SimulationConfig(
        duration_ns=s_to_ns(setting.duration_s - WARMUP_S),
        warmup_ns=s_to_ns(WARMUP_S),
        devices=setting.devices,
        seed=seed,
    )
    workload = Composition(parts)
    arrivals = generate_arrivals(workload, models, config)
    report = simulate("clockwork", models, workload, config, arrivals, settings={"guard_tight": guard}).report
    by_label = report.by_label  # counted from the warm-up on
    batch = sum(v["goodput_rps"] for label, v in by_label.items() if label.startswith("batch"))
    return Outcome(by_label.get("tight", {}).get("slo_attainment", 1.0), batch, report.device_busy)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--only", default="", help="run only settings whose name contains this")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    columns = ["setting", "seed", "tight alone", "with batch, guard off", "guard on"]
    columns += ["batch r/s off", "on", "capacity left", "on / capacity"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * 9)
    for setting in SETTINGS:
        if args.only not in setting.name:
            continue
        for seed in seeds:
            alone = _run(setting, True, False, True, seed)
            batch_only = _run(setting, False, True, True, seed)
            off = _run(setting, True, True, False, seed)
            on = _run(setting, True, True, True, seed)
            capacity = batch_only.batch_rps * max(0.0, 1.0 - alone.busy)
            name = setting.name + (" (tuned)" if setting.tuned else "")
            share = on.batch_rps / capacity if capacity else 0.0
            cells = [
                name,
                seed,
                f"{alone.tight:.2%}",
                f"{off.tight:.2%}",
                f"{on.tight:.2%}",
                f"{off.batch_rps:.0f}",
                f"{on.batch_rps:.0f}",
                f"{capacity:.0f}",
                f"{share:.0%}",
            ]
            print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
