"""Fit the simulator's live-process cost model (``mainspring.cells.cost``: ``ProcessCost``, ``FrontendCost``)
to the rows ``controller_cost_live.py --json`` writes.

Each part of the controller's loop (the ledger's parts), the process's other threads and the frontend process
are fitted by non-negative least squares over the rows (one per offered rate):
``cpu_s = a * answered + b * actions + c * seconds``, each part with the terms its work can grow with (the
policy keeps its own per-call fit, ``controller_cost_fit.py``; its row here is for comparison). Prints the
coefficients, each row's predicted over measured total for the controller process and the frontend, and
the constants to paste into ``cells/cost.py``:

- per request taken in: receive, admission, metrics and the loop's own work per request answered;
- per request answered: answer; per action sent: send, metrics and the loop's own per action;
- per result: receive and results per action; a refusal at the controller: receive and answer per request;
- background: the signal's and the loop's per second, as a share of the core;
- the other threads (ZeroMQ's I/O) run beside the loop, on another core: printed, not charged.

The frontend's refusal (a 429 before the body is read) is not in the rows (no refusals below the knee): it
is ``--refusal-fraction`` of a served call's cost, an estimate.

    .venv/bin/python benchmarks/controller_cost_live.py --rates 300,600,900 --json rows.json
    .venv/bin/python benchmarks/live_cost_fit.py rows.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np

TERMS = ("answered", "actions", "seconds")
# The terms each part's work can grow with: a part fitted on a term it cannot depend on would take a share
# of another's (answered and actions rise together) and extrapolate wrongly where batches differ.
PART_TERMS = {
    "receive": ("answered", "actions"),  # the requests, and the results (one per action)
    "admission": ("answered",),
    "policy": TERMS,
    "send": ("actions",),
    "results": ("actions",),
    "answer": ("answered",),
    "metrics": ("answered", "actions"),
    "signal": ("seconds",),
    "unattributed": TERMS,
    "other threads": TERMS,
    "frontend": ("answered", "seconds"),
}
LOOP_PARTS = ("receive", "admission", "policy", "send", "results", "answer", "metrics", "signal", "unattributed")


def nnls(columns: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient at least 0: the best unconstrained fit over each subset of the
    columns whose coefficients are all non-negative (exact, and cheap for three columns)."""
    best, best_residual = np.zeros(columns.shape[1]), float(np.sum(measured**2))
    for size in range(1, columns.shape[1] + 1):
        for subset in itertools.combinations(range(columns.shape[1]), size):
            fitted, *_ = np.linalg.lstsq(columns[:, subset], measured, rcond=None)
            if np.any(fitted < 0):
                continue
            residual = float(np.sum((columns[:, subset] @ fitted - measured) ** 2))
            if residual < best_residual:
                best, best_residual = np.zeros(columns.shape[1]), residual
                best[list(subset)] = fitted
    return best


def part_cpu_s(row: dict[str, float], part: str) -> float:
    if part == "frontend":
        return row["frontend_cpu_s"]
    if part == "other threads":
        return row["controller_cpu_s"] - sum(row[p + "_cpu_s"] for p in LOOP_PARTS)
    return row[part + "_cpu_s"]


def fit(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each part's coefficients: seconds of CPU per request answered, per action, per second."""
    fitted: dict[str, dict[str, float]] = {}
    for part, terms in PART_TERMS.items():
        columns = np.array([[row[t] for t in terms] for row in rows], dtype=float)
        measured = np.array([part_cpu_s(row, part) for row in rows], dtype=float)
        coefficients = nnls(columns, measured)
        fitted[part] = dict.fromkeys(TERMS, 0.0) | dict(zip(terms, map(float, coefficients), strict=True))
    return fitted


def predict(fitted: dict[str, dict[str, float]], row: dict[str, float], parts: tuple[str, ...]) -> float:
    return sum(fitted[p][t] * row[t] for p in parts for t in TERMS)


def constants(fitted: dict[str, dict[str, float]], refusal_fraction: float) -> str:
    def ns(*terms: tuple[str, str]) -> int:
        return int(round(sum(fitted[part][term] for part, term in terms) * 1e9, -2))

    request = ns(("receive", "answered"), ("admission", "answered"), ("metrics", "answered"),
                 ("unattributed", "answered"))  # fmt: skip
    answer = ns(("answer", "answered"))
    action = ns(("send", "actions"), ("metrics", "actions"), ("unattributed", "actions"))
    result = ns(("receive", "actions"), ("results", "actions"))
    refusal = ns(("receive", "answered"), ("answer", "answered"))
    background = round(fitted["signal"]["seconds"] + fitted["unattributed"]["seconds"], 4)
    front = ns(("frontend", "answered"))
    front_background = round(fitted["frontend"]["seconds"], 4)
    return (
        f"LIVE_PROCESS_COST = ProcessCost(\n"
        f"    request_ns={request:_}, answer_ns={answer:_}, action_ns={action:_}, result_ns={result:_}, "
        f"refusal_ns={refusal:_}, background={background}\n)\n"
        f"LIVE_FRONTEND_COST = FrontendCost(request_ns={front:_}, "
        f"refusal_ns={int(round(front * refusal_fraction, -2)):_}, background={front_background})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=Path, help="controller_cost_live.py --json's file")
    parser.add_argument("--refusal-fraction", type=float, default=0.25,
                        help="a frontend's refusal as a share of a served call's cost (not measured)")  # fmt: skip
    args = parser.parse_args()
    every = json.loads(args.rows.read_text())
    rows = [row for row in every if "receive_cpu_s" in row]  # the ledger's rows: the split by part
    if len(rows) < 2:
        raise SystemExit(f"{args.rows}: at least two rows with the ledger on are needed (several rates)")
    fitted = fit(rows)
    print(f"{'part':<14} {'us/answered':>11} {'us/action':>9} {'ms/s':>7}")
    for part, terms in fitted.items():
        print(f"{part:<14} {terms['answered'] * 1e6:>11.1f} {terms['actions'] * 1e6:>9.1f} "
              f"{terms['seconds'] * 1e3:>7.1f}")  # fmt: skip
    controller = (*LOOP_PARTS, "other threads")
    print(f"\n{'ledger':>6} {'rate':>6} {'answered':>8} {'actions':>8} {'controller pred/meas':>20} "
          f"{'frontend pred/meas':>18}")  # fmt: skip
    for row in every:  # the ledger-off rows too: what the ledger itself costs shows as a ratio above 1
        ctrl = predict(fitted, row, controller) / max(row["controller_cpu_s"], 1e-9)
        front = predict(fitted, row, ("frontend",)) / max(row["frontend_cpu_s"], 1e-9)
        print(f"{row.get('ledger', '?'):>6} {row['rate']:>6.0f} {row['answered']:>8.0f} {row['actions']:>8.0f} "
              f"{ctrl:>20.2f} {front:>18.2f}")  # fmt: skip
    print("\n# for cells/cost.py (the loop's parts less the policy; the other threads are not charged):")
    print(constants(fitted, args.refusal_fraction))


if __name__ == "__main__":
    main()
