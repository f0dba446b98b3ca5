"""Policy cost in instructions: this checkout against another, side by side, nearly free of the machine's noise.

CPU time per request (``controller_cost.py``) moves by a third between moments on a shared
machine, and by half when another process shares the core, which hides a 10% change. This
counts the instructions the whole simulation executes under valgrind's cachegrind (a few
seconds of simulated time take minutes), for this checkout and for ``--other`` (the ``src``
directory of another checkout, e.g. from ``git worktree add /tmp/before <commit>``), with the
same hash seed, and subtracts each side's setup (the same run with no simulated time). The
workload is ``controller_cost.py``'s: N devices, 50 model copies each, Poisson arrivals at
250 r/s per device, every model starting cold. Needs valgrind (``apt-get install valgrind``).
Nearly free of noise, not entirely: one checkout against itself gave 1.004x, and the same
checkout counted 1,058,446 and 1,070,205 instructions per request at 8 devices in two runs
(2026-12-02), so differences under about 1% are not resolved.

    .venv/bin/python benchmarks/policy_instructions.py --other /tmp/before/src [--devices 1 4 8] [--duration-s 2]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE_SRC = Path(__file__).resolve().parent.parent / "src"


def simulate_once(policy: str, devices: int, duration_s: float) -> None:
    """The child: one simulation; prints the number of requests."""
    from mainspring.models.profile import builtin_profiles, model_copies
    from mainspring.sim.run import SimulationConfig, simulate
    from mainspring.time import s_to_ns
    from mainspring.workload import PoissonOpenLoop

    models = model_copies(builtin_profiles(), 50 * devices)
    if duration_s <= 0:
        print("requests 0")  # setup only: imports and the model table
        return
    config = SimulationConfig(duration_ns=s_to_ns(duration_s), devices=devices, seed=3)
    result = simulate(policy, models, PoissonOpenLoop(250.0 * devices), config)
    print(f"requests {len(result.recorder.requests)}")


def count(src: Path, policy: str, devices: int, duration_s: float) -> tuple[int, int]:
    """(instructions, requests) of one child run against the package in ``src``."""
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONHASHSEED="0")
    valgrind = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    child = ["--child", "--policy", policy, "--devices", str(devices), "--duration-s", str(duration_s)]
    command = [*valgrind, sys.executable, __file__, *child]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    refs = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    requests = re.search(r"requests (\d+)", done.stdout)
    if refs is None or requests is None:
        raise RuntimeError(f"no instruction count from cachegrind: {done.stderr[-500:]}")
    return int(refs.group(1).replace(",", "")), int(requests.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, help="src directory of the checkout to compare with")
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--duration-s", type=float, default=2.0, help="simulated seconds per run")
    parser.add_argument("--policy", default="clockwork")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        simulate_once(args.policy, args.devices[0], args.duration_s)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is needed: apt-get install valgrind")
    sides = [("this", HERE_SRC)] + ([("other", args.other.resolve())] if args.other else [])
    print(f"{'devices':>7} {'side':>5} {'requests':>8} {'instructions/request':>20} {'this/other':>10}", flush=True)
    for devices in args.devices:
        per_request = {}
        for side, src in sides:
            setup, _ = count(src, args.policy, devices, 0.0)
            total, requests = count(src, args.policy, devices, args.duration_s)
            per_request[side] = (total - setup) / max(requests, 1)
            ratio = f"{per_request['this'] / per_request['other']:10.3f}" if side == "other" else ""
            print(f"{devices:>7} {side:>5} {requests:>8} {per_request[side]:>20,.0f} {ratio}", flush=True)


if __name__ == "__main__":
    main()
