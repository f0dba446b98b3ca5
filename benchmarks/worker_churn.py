"""Worker memory over model churn (issue 55): N unload+load cycles of one model on a real ``TorchWorker``.

A cycle is what the repository API's ``unload`` then ``load`` make a worker do: evict the weights, unregister
and register the model (each on a thread of its own, as the worker process runs a model operation: reading the
file and warming every batch size up), load the weights into pages and answer one inference. Each variant runs
in a fresh process: first, for ``--baseline-cycles``, a worker that keeps what reading a model leaves behind (as
before issue 55), then the worker as it is, which lets go of it (``worker/runtimes/load_leftovers.py``).
Prints each variant's RSS after ``--warmup-cycles`` and after its last cycle, the difference, and the growth per
100 cycles after the warm-up (a least-squares slope); every sample also goes to ``--out`` as it is taken (JSON
lines), so a long run can be read while it goes:

    nice -n 10 .venv/bin/python benchmarks/worker_churn.py [--cycles 2000] [--baseline-cycles 400] \
        [--model resnet18] [--image-size 64] [--out worker_churn.jsonl]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.torch_models import Results  # noqa: E402

from mainspring.models.loading import export_zoo_model  # noqa: E402
from mainspring.models.profiler import sample_inputs  # noqa: E402
from mainspring.models.repository import ModelRepository  # noqa: E402
from mainspring.models.zoo import ARCHITECTURES  # noqa: E402
from mainspring.protocol.models import ModelOperation, ModelTarget  # noqa: E402
from mainspring.protocol.pages import MIB  # noqa: E402
from mainspring.worker.api import apply_model_operation  # noqa: E402
from mainspring.worker.torch_worker import TorchWorker  # noqa: E402


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of a process, in MB (10^6 bytes), from ``/proc``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no VmRSS for process {pid}")


def on_own_thread(work: Callable[[], object]) -> None:
    """Run ``work`` on a fresh thread and wait: a worker process runs each model operation so."""
    failure: list[object] = []

    def run() -> None:
        reply = work()
        if getattr(reply, "error", ""):
            failure.append(reply)

    thread = threading.Thread(target=run, name="model-op")
    thread.start()
    thread.join()
    if failure:
        raise RuntimeError(f"model operation failed: {failure[0]}")


class Churn:
    """One worker serving one model, unloaded and loaded again and again."""

    def __init__(self, repo: ModelRepository, model: str, keep_leftovers: bool) -> None:
        self.model = model
        self.results = Results()
        self.worker = TorchWorker(
            repo, self.results.put, models=[model], pool_bytes=256 * MIB, keep_load_leftovers=keep_leftovers
        )
        self.samples = sample_inputs(self.worker.configs()[model], 1, seed=0)
        self._op = 0

    def _run(self, action: object, inputs: object = None) -> None:
        self.worker.submit(action, inputs)  # type: ignore[arg-type]
        result = self.results.wait(action.action_id, timeout_s=120)  # type: ignore[attr-defined]
        assert result.status.name == "OK", result.message

    def _model_op(self, operation: ModelOperation) -> None:
        self._op += 1
        op_id = self._op
        on_own_thread(lambda: apply_model_operation(self.worker, op_id, operation, ModelTarget(self.model)))

    def cycle(self) -> None:
        self._run(self.results.load(self.model))
        self._run(self.results.infer(self.model, requests=1, batch=1), self.samples)
        self._run(self.results.evict(self.model))
        self._model_op(ModelOperation.UNLOAD)
        self._model_op(ModelOperation.LOAD)


def child(args: argparse.Namespace) -> None:
    """One variant: print a JSON line per sample of RSS."""
    churn = Churn(ModelRepository(Path(args.repo)), args.model, args.keep_leftovers)
    begin = time.monotonic()
    try:
        for cycle in range(1, args.cycles + 1):
            churn.cycle()
            if cycle % args.every == 0 or cycle in (args.warmup_cycles, args.cycles):
                sample = {"cycle": cycle, "rss_mb": round(rss_mb(), 2), "s": round(time.monotonic() - begin, 1)}
                print(json.dumps(sample), flush=True)
    finally:
        churn.worker.close()


def slope_per_100(samples: list[tuple[int, float]]) -> float:
    """MB per 100 cycles: the least-squares line through (cycle, RSS)."""
    if len(samples) < 2:
        return float("nan")
    n = len(samples)
    mean_x = sum(x for x, _ in samples) / n
    mean_y = sum(y for _, y in samples) / n
    spread = sum((x - mean_x) ** 2 for x, _ in samples)
    return 100 * sum((x - mean_x) * (y - mean_y) for x, y in samples) / spread if spread else float("nan")


def run_variant(name: str, cycles: int, args: argparse.Namespace, repo: Path, out: Path) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", "--repo", str(repo), "--model", args.model, "--cycles",
               str(cycles), "--every", str(args.every), "--warmup-cycles", str(args.warmup_cycles)]  # fmt: skip
    if name == "kept (before)":
        command.append("--keep-leftovers")
    samples: list[tuple[int, float]] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process, out.open("a") as log:
        assert process.stdout is not None
        for line in process.stdout:
            sample = json.loads(line)
            samples.append((sample["cycle"], sample["rss_mb"]))
            log.write(json.dumps({"variant": name, **sample}) + "\n")
            log.flush()
            print(f"  {name:14s} cycle {sample['cycle']:5d}: RSS {sample['rss_mb']:7.1f} MB ({sample['s']:.0f} s)",
                  flush=True)  # fmt: skip
    if process.returncode:
        raise SystemExit(f"{name}: the worker process failed ({process.returncode})")
    after_warmup = dict(samples)[args.warmup_cycles]
    last = samples[-1][1]
    return {"cycles": cycles, "after_warmup": after_warmup, "last": last, "growth": last - after_warmup,
            "per_100": slope_per_100([(c, r) for c, r in samples if c >= args.warmup_cycles])}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--baseline-cycles", type=int, default=400, help="cycles kept as before issue 55; 0: none")
    parser.add_argument("--warmup-cycles", type=int, default=200)
    parser.add_argument("--every", type=int, default=50, help="sample RSS every this many cycles")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("worker_churn.jsonl"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repo", help=argparse.SUPPRESS)
    parser.add_argument("--keep-leftovers", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if min(args.cycles, args.baseline_cycles or args.cycles) <= args.warmup_cycles:
        parser.error("--cycles and --baseline-cycles must be more than --warmup-cycles")
    with tempfile.TemporaryDirectory() as scratch:
        repo = ModelRepository(Path(scratch))
        arch_args = {"image_size": args.image_size} if "image_size" in ARCHITECTURES[args.model].defaults else {}
        export_zoo_model(repo, args.model, args=arch_args)
        variants = [("kept (before)", args.baseline_cycles)] if args.baseline_cycles else []
        variants.append(("dropped (now)", args.cycles))
        figures = {name: run_variant(name, cycles, args, repo.root, args.out) for name, cycles in variants}
    print(f"\n{args.model}, unload+load cycles; RSS in MB")
    header = ("variant", "cycles", f"after {args.warmup_cycles}", "after N", "diff", "per 100")
    print("{:14s} {:>6s} {:>10s} {:>8s} {:>7s} {:>8s}".format(*header))
    for name, f in figures.items():
        print(f"{name:14s} {f['cycles']:6.0f} {f['after_warmup']:10.1f} {f['last']:8.1f} {f['growth']:+7.1f} "
              f"{f['per_100']:+8.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
