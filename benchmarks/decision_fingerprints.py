"""Decision fingerprints: a hash of the action and request logs of ten simulated configurations.

A change that should leave the policy's decisions alone (a refactor, a faster index) must leave
every fingerprint as it was; run it before the change with ``--save`` and after it with ``--check``.
The configurations span one to 150 devices, uniform and Zipf popularity, bursts, a closed loop,
a tight SLO and the Azure trace with loads and evictions on Clockwork's V100 profiles, and a
noisy CPU device (``closed_loop_noise.py``'s), where the CPU estimate percentile applies.

    .venv/bin/python benchmarks/decision_fingerprints.py --save /tmp/before.json
    .venv/bin/python benchmarks/decision_fingerprints.py --check /tmp/before.json [--policy clockwork]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

from closed_loop_noise import CPU_RESNET18, SHARED_CPU_NOISE
from mainspring.models.profile import ModelProfile, builtin_profiles, model_copies
from mainspring.protocol import CPU_KIND
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import NS_PER_S, ms_to_ns
from mainspring.workload import AzureTrace, BurstyOnOff, ClosedLoop, PoissonOpenLoop, Workload

# name: (workload, devices, model copies, simulated seconds, SLO ms, seed)
CONFIGS: dict[str, tuple[Workload, int, int, float, int, int]] = {
    "poisson-1": (PoissonOpenLoop(250.0), 1, 50, 4.0, 100, 3),
    "poisson-8": (PoissonOpenLoop(2_000.0), 8, 400, 2.0, 100, 3),
    "poisson-32": (PoissonOpenLoop(8_000.0), 32, 1_600, 1.0, 100, 3),
    "poisson-150": (PoissonOpenLoop(37_500.0), 150, 7_500, 0.3, 100, 3),
    "zipf-4": (PoissonOpenLoop(1_200.0, "zipf"), 4, 200, 3.0, 100, 5),
    "zipf-1-slo25": (PoissonOpenLoop(300.0, "zipf"), 1, 30, 4.0, 25, 7),
    "bursty-12": (BurstyOnOff(15.0, mean_on_s=0.5, mean_off_s=1.0), 12, 600, 3.0, 100, 11),
    "closed-1": (ClosedLoop(240), 1, 15, 4.0, 100, 1),
    "azure-3-x10": (AzureTrace(scale=10), 3, 600, 10.0, 100, 7),
    "azure-6-x30": (AzureTrace(scale=30), 6, 4_026, 5.0, 100, 1),
    "cpu-closed-1": (ClosedLoop(16), 1, 1, 10.0, 102, 1),
    "cpu-zipf-2": (PoissonOpenLoop(150.0, "zipf"), 2, 6, 10.0, 102, 2),
}


def fingerprint(policy: str, name: str, scratch: Path) -> str:
    workload, devices, copies, seconds, slo_ms, seed = CONFIGS[name]
    duration, slo = int(seconds * NS_PER_S), ms_to_ns(slo_ms)
    models: list[ModelProfile]
    if name.startswith("cpu-"):
        models = model_copies([CPU_RESNET18], copies)
        config = SimulationConfig(duration, devices, CPU_KIND, slo_ns=slo, seed=seed, noise=SHARED_CPU_NOISE)
    else:
        models = model_copies(builtin_profiles(), copies)
        config = SimulationConfig(duration, devices, slo_ns=slo, seed=seed)
    result = simulate(policy, models, workload, config)
    requests, actions = result.recorder.write_logs(scratch, name)
    digest = hashlib.sha256(actions.read_bytes())
    digest.update(requests.read_bytes())
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="clockwork")
    parser.add_argument("--only", nargs="*", choices=sorted(CONFIGS), help="a subset of the configurations")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--save", type=Path, help="write the fingerprints to this JSON file")
    target.add_argument("--check", type=Path, help="compare with the fingerprints in this JSON file")
    args = parser.parse_args()
    expected = json.loads(args.check.read_text()) if args.check else {}
    found: dict[str, str] = {}
    differ = 0
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.only or CONFIGS:
            began = time.perf_counter()
            found[name] = fingerprint(args.policy, name, Path(scratch))
            verdict = ""
            if args.check:
                same = expected.get(name) == found[name]
                differ += not same
                verdict = "same" if same else "DIFFERENT"
            print(f"{name:14} {found[name][:16]} {verdict:9} ({time.perf_counter() - began:.1f} s)", flush=True)
    if args.save:
        args.save.write_text(json.dumps(found, indent=1) + "\n")
    if args.check:
        print("all identical" if not differ else f"{differ} configuration(s) decided differently")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
