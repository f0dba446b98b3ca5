"""What compiling the policy would buy: the clockwork policy as plain Python and compiled by mypyc, side by side.

The issue's aim for the policy (25 us per request at 32 devices) asks whether the interpreter or
the design is what stands in the way. This copies the package to a temporary directory, compiles
the policy's modules there with mypyc (the compiler that ships with mypy: the same typed source,
no code of ours in C), and runs ``controller_cost.py``'s measurement against each copy in turn,
alternating, each in a process of its own. The decisions must be the same (the offered load and
goodput of each run are compared exactly); what may differ is the policy's CPU per request.
Needs a C compiler and Python's headers. The product does not use the compiled copy: the issue
asks for plain Python on the hot path, and this measures what that choice costs.

    .venv/bin/python benchmarks/policy_compiled.py [--devices 8 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "src" / "mainspring"
POLICY_DIR = Path("mainspring") / "scheduler" / "clockwork"
NOT_COMPILED = {"__init__.py", "tier_order.py"}  # tier_order subclasses ``set``, which mypyc's classes cannot


def compile_copy(into: Path, modules: list[str] | None = None) -> list[str]:
    """Copy the package under ``into`` and compile the policy's modules (or ``modules``, file names
    in the policy's directory) there in place; the names compiled."""
    shutil.copytree(PACKAGE, into / "mainspring", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    names = modules or sorted(p.name for p in (into / POLICY_DIR).glob("*.py") if p.name not in NOT_COMPILED)
    mypyc = Path(sys.executable).with_name("mypyc")
    command = [str(mypyc) if mypyc.exists() else "mypyc", *(str(POLICY_DIR / name) for name in names)]
    done = subprocess.run(command, cwd=into, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mypyc failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return names


def run_side(src: Path, devices: int, rate: float, warmup_s: float, duration_s: float) -> dict[str, float]:
    """``controller_cost.measure`` in a child process that imports the package from ``src``."""
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{HERE}", PYTHONHASHSEED="0")
    args = ["--child", "--devices", str(devices), "--rate-per-device", str(rate)]
    args += ["--warmup-s", str(warmup_s), "--duration-s", str(duration_s)]
    done = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, check=True)
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def child(devices: int, rate: float, warmup_s: float, duration_s: float) -> None:
    from controller_cost import measure

    figures = measure("clockwork", devices, rate, warmup_s, duration_s)
    prefix = "mainspring.scheduler.clockwork."
    loaded = [m for name, m in sys.modules.items() if name.startswith(prefix) and not name.endswith("__mypyc")]
    figures["compiled_modules"] = float(sum(not str(m.__file__).endswith(".py") for m in loaded))
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rate-per-device", type=float, default=250.0)
    parser.add_argument("--warmup-s", type=float, default=1.5)
    parser.add_argument("--duration-s", type=float, default=1.5, help="simulated seconds measured after the warm-up")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side per device count, alternating")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.devices[0], args.rate_per_device, args.warmup_s, args.duration_s)
        return
    with tempfile.TemporaryDirectory(prefix="mainspring-mypyc-") as tmp:
        print("compiling the policy's modules with mypyc ...", flush=True)
        compiled = compile_copy(Path(tmp))
        print(f"compiled: {', '.join(compiled)}\n", flush=True)
        sides = {"plain": PACKAGE.parent, "compiled": Path(tmp)}
        print(f"{'devices':>7} {'side':>8} {'goodput r/s':>11} {'steady us/req':>13} {'plain/compiled':>14}")
        for devices in args.devices:
            runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
            for _ in range(args.repeats):
                for side, src in sides.items():
                    m = run_side(src, devices, args.rate_per_device, args.warmup_s, args.duration_s)
                    expected = len(compiled) if side == "compiled" else 0
                    if m["compiled_modules"] != expected:  # a check that must survive ``python -O``
                        raise RuntimeError(f"the {side} side imported the wrong copy of the package")
                    runs[side].append(m)
                    print(f"{devices:>7} {side:>8} {m['goodput']:>11.1f} {m['steady_us']:>13.1f}", flush=True)
            same = {(m["offered"], m["goodput"]) for ms in runs.values() for m in ms}
            ratios = [p["steady_us"] / c["steady_us"] for p, c in zip(runs["plain"], runs["compiled"], strict=True)]
            verdict = "same decisions" if len(same) == 1 else "DECISIONS DIFFER"
            print(f"{devices:>7} {'':>8} {verdict:>11} {'':>13} {min(ratios):>6.2f}-{max(ratios):.2f}x\n", flush=True)


if __name__ == "__main__":
    main()
