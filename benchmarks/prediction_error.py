"""Prediction error (Clockwork's Fig. 10): actual minus expected duration of every infer and load.

Runs the Azure replay (4,026 models, 6 devices, default noise model) under a policy
and prints the distribution of (measured - predicted) per action kind, in ms and
relative to the prediction. Negative means the action finished earlier than
predicted (the estimate is a p99, so most are).

    .venv/bin/python benchmarks/prediction_error.py [--trace-scale 20] [--duration-s 600] [--plot FILE]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from mainspring.models.profile import builtin_profiles, model_copies
from mainspring.sim.run import SimulationConfig, simulate
from mainspring.time import s_to_ns
from mainspring.workload import AzureTrace

PERCENTILES = (0.1, 1, 10, 50, 90, 99, 99.9, 99.99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-scale", type=float, default=20.0)
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--policy", default="clockwork")
    parser.add_argument("--plot", type=Path, help="write a PNG of the error CDFs here")
    args = parser.parse_args()
    models = model_copies(builtin_profiles(), 4026)
    config = SimulationConfig(duration_ns=s_to_ns(args.duration_s), devices=6)
    result = simulate(args.policy, models, AzureTrace(scale=args.trace_scale), config)
    errors: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    print(f"{args.policy}, Azure x{args.trace_scale:g}, {args.duration_s:g} s: actual - expected")
    print(f"{'kind':>6} {'count':>7} {'late':>6} " + " ".join(f"{'p' + format(p, 'g'):>8}" for p in PERCENTILES))
    for kind in ("infer", "load"):
        rows = [a for a in result.recorder.actions if a.kind == kind and a.status == "ok"]
        error_ms = np.array([(a.end_ns - a.begin_ns - a.expected_ns) / 1e6 for a in rows])
        relative = np.array([(a.end_ns - a.begin_ns) / a.expected_ns - 1 for a in rows])
        errors[kind] = (error_ms, relative)
        late = float(np.mean(error_ms > 0)) if rows else 0.0
        cells = " ".join(f"{np.percentile(error_ms, p):>+8.3f}" for p in PERCENTILES) if rows else ""
        print(f"{kind:>6} {len(rows):>7} {late:>6.1%} {cells}   ms")
        cells = " ".join(f"{np.percentile(relative, p):>+8.1%}" for p in PERCENTILES) if rows else ""
        print(f"{'':>6} {'':>7} {'':>6} {cells}   of the prediction")
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for kind, (error_ms, _) in errors.items():
            ordered = np.sort(error_ms)
            ax.plot(ordered, np.arange(1, ordered.size + 1) / ordered.size, label=kind)
        ax.set_xlabel("actual - expected duration (ms)")
        ax.set_ylabel("CDF")
        ax.set_xscale("symlog", linthresh=0.1)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
