"""A live run replayed in the simulator: its own arrivals, its worker's own batch times.

Live misses on a shared 2-core machine come from the policy's decisions or from the machine.
This takes a run logged by ``mainspring serve --log-dir`` (one CPU device) and simulates the
same arrivals (model, time, SLO) under the same policy three times, on one CPU device whose
batch of each size takes the median the worker measured in that run: with the run's own noise
around it (fitted: ``fitted_noise``), with ``closed_loop_noise.py``'s shared-CPU noise (jitter and
5% of runs 1.5-3.5x slower), and with the batch times given by ``--quiet-ms`` instead (the model
in a quiet process; default: resnet18 64x64's on this machine) and that noise. Loads take the
run's median throughout. Where the first replay lands on the live figure, what the run lost
beyond the last is the machine's speed and noise in that run, not the policy's decisions.

    .venv/bin/python benchmarks/live_vs_sim.py LOG_DIR [--run NAME] [--seeds 1 2 3]
        [--policy clockwork] [--pool-mib 480] [--weights-mib 44.6] [--quiet-ms 1=9.8 2=16.6 4=23.5 8=40.3]
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics
from pathlib import Path

from closed_loop_noise import CPU_RESNET18, SHARED_CPU_NOISE
from mainspring.models.profile import ModelProfile
from mainspring.protocol import CPU_KIND
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.telemetry.analyze import met_slo, read_run, runs
from mainspring.time import ms_to_ns, ns_to_ms
from mainspring.worker.runtimes.emulated import NoiseModel
from mainspring.workload import Arrival, PoissonOpenLoop

NETWORK_NS = ms_to_ns(0.5)  # client to server and back on loopback, about


def measured_profiles(actions: dict[int, dict[str, str]], weights_bytes: int) -> dict[str, ModelProfile]:
    """Per model: the median measured duration of each batch size it ran, and of its loads. A size
    that one model never ran takes the median of the other models' runs of it (copies of one model)."""
    runs_by: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    loads: dict[str, list[int]] = collections.defaultdict(list)
    for action in actions.values():
        if action["status"] != "ok":
            continue
        took = int(action["end_ns"]) - int(action["begin_ns"])
        if action["kind"] == "infer":
            runs_by[(action["model"], int(action["batch_size"]))].append(took)
        elif action["kind"] == "load":
            loads[action["model"]].append(took)
    by_size: dict[int, list[int]] = collections.defaultdict(list)
    for (_, size), took in runs_by.items():
        by_size[size] += took
    pooled = {size: round(statistics.median(took)) for size, took in by_size.items()}
    all_loads = [took for taken in loads.values() for took in taken] or [CPU_RESNET18.load_ns]
    models = {model for model, _ in runs_by} | set(loads)
    return {
        model: ModelProfile(
            model=model,
            device_kind=CPU_KIND,
            weights_bytes=weights_bytes,
            load_ns=round(statistics.median(loads.get(model) or all_loads)),
            exec_ns={s: round(statistics.median(runs_by.get((model, s)) or [pooled[s]])) for s in pooled},
        )
        for model in sorted(models)
    }


def fitted_noise(actions: dict[int, dict[str, str]], profiles: dict[str, ModelProfile]) -> NoiseModel:
    """The run's own noise around those medians: log-normal jitter as wide as the middle 90% of
    the infers' durations over their median, and spikes as often as runs took over 1.5x it, drawn
    uniformly up to the 95th percentile of those runs' factors."""
    ratios = sorted(
        (int(a["end_ns"]) - int(a["begin_ns"])) / profiles[a["model"]].exec_ns[int(a["batch_size"])]
        for a in actions.values()
        if a["kind"] == "infer" and a["status"] == "ok"
    )
    n = len(ratios)
    spikes = [r for r in ratios if r > 1.5]
    middle = ratios[n // 20 : n - n // 20] or ratios
    return NoiseModel(
        jitter_sigma=statistics.pstdev(math.log(r) for r in middle),
        spike_probability=len(spikes) / n,
        spike_min_factor=1.5,
        spike_max_factor=spikes[int(0.95 * (len(spikes) - 1))] if spikes else 1.5,
    )


def arrivals_of(requests: list[dict[str, str]]) -> list[Arrival]:
    first = min(int(r["arrival_ns"]) for r in requests)
    return sorted(
        (
            Arrival(int(r["arrival_ns"]) - first, r["model"], int(r["deadline_ns"]) - int(r["arrival_ns"]))
            for r in requests
        ),
        key=lambda a: a.time_ns,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("--run", help="the run's name (default: the last in the directory)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--policy", default="clockwork")
    parser.add_argument("--pool-mib", type=float, default=None, help="the device's pool (default: the simulator's)")
    parser.add_argument("--weights-mib", type=float, default=CPU_RESNET18.weights_bytes / 2**20)
    parser.add_argument("--quiet-ms", nargs="+", default=[], help="SIZE=MS batch times in a quiet process")
    args = parser.parse_args()
    run = args.run or runs(args.log_dir)[-1]
    requests, actions = read_run(args.log_dir, run)
    live = measured_profiles(actions, round(args.weights_mib * 2**20))
    quiet_ms = dict(item.split("=", 1) for item in args.quiet_ms)
    quiet_ns = {int(k): ms_to_ns(float(v)) for k, v in quiet_ms.items()} or CPU_RESNET18.exec_ns
    quiet = {
        m: ModelProfile(m, CPU_KIND, p.weights_bytes, p.load_ns, quiet_ns) for m, p in live.items()
    }  # loads as live
    arrivals = arrivals_of(requests)
    some = next(iter(live.values()))
    print(
        f"{run}: {len(requests)} requests over {len(live)} model(s); live attainment "
        f"{sum(met_slo(r) for r in requests) / len(requests):.2%}"
    )
    print(
        "batch ms, live medians:",
        ", ".join(f"{s}: {ns_to_ms(t):.1f}" for s, t in sorted(some.exec_ns.items())),
        f"(load {ns_to_ms(some.load_ns):.1f}); quiet:",
        ", ".join(f"{s}: {ns_to_ms(t):.1f}" for s, t in sorted(quiet_ns.items())),
    )
    pool = {} if args.pool_mib is None else {"pool_bytes": round(args.pool_mib * 2**20)}
    noise, shared = fitted_noise(actions, live), SHARED_CPU_NOISE
    print(
        f"the run's noise: jitter sigma {noise.jitter_sigma:.3f}, {noise.spike_probability:.1%} of infers over "
        f"1.5x their median, up to {noise.spike_max_factor:.2f}x (the shared-CPU model: sigma {shared.jitter_sigma}, "
        f"{shared.spike_probability:.0%}, up to {shared.spike_max_factor}x)"
    )
    replays = (
        ("live medians, the run's noise", live, noise),
        ("live medians, shared-CPU noise", live, SHARED_CPU_NOISE),
        ("quiet times, shared-CPU noise", quiet, SHARED_CPU_NOISE),
    )
    for label, profiles, noise_model in replays:
        cells = []
        for seed in args.seeds:
            config = SimulationConfig(
                duration_ns=arrivals[-1].time_ns + 1, devices=1, device_kind=CPU_KIND, seed=seed,
                noise=noise_model, network_latency_ns=NETWORK_NS, **pool,
            )  # fmt: skip
            workload = PoissonOpenLoop(1.0)  # unused: the arrivals are the run's
            report = simulate(args.policy, list(profiles.values()), workload, config, arrivals).report
            cells.append(f"{report.slo_attainment:.2%}")
        print(f"{label:31} seeds {' '.join(map(str, args.seeds))}: {' / '.join(cells)}", flush=True)


if __name__ == "__main__":
    main()
