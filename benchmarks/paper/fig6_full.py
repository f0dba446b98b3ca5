"""Fig. 6's whole run as a section's closing text: the tables from ``fig6.py --rows`` files.

    .venv/bin/python benchmarks/paper/fig6_full.py ROWS.jsonl [ROWS.jsonl ...] [--every-s 300] [--note TEXT]

Each file holds one or more policies' rows (a JSON line per 60 s, then a summary line once a run ends);
a run cut short shows the buckets it reached. Prints the markdown; ``fig6.py`` keeps
``fig6_full.md`` (this output, committed) in its section.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from common import markdown_table
from fig6 import ROWS_BUCKET_S, SERIES_HEADER, SUMMARY_HEADER, attainment


def read(paths: list[Path]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[str]]]:
    buckets: dict[str, list[dict[str, Any]]] = {}
    summaries: dict[str, list[str]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "summary" in row:
                summaries[row["policy"]] = row["summary"]
            else:
                buckets.setdefault(row["policy"], []).append(row)
    return buckets, summaries


def merged(rows: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """``every`` buckets as one (a last, shorter group is left out)."""
    out = []
    for start in range(0, len(rows) - every + 1, every):
        group = rows[start : start + every]
        out.append({
            "start_s": group[0]["start_s"], "active_majors": group[0]["active_majors"],
            **{k: sum(r[k] for r in group) for k in ("loads", "evictions", "load_ns", "exec_ns")},
            **{k: (sum(r[k][0] for r in group), sum(r[k][1] for r in group)) for k in ("minor", "major")},
        })  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", type=Path, nargs="+")
    p.add_argument(
        "--every-s", type=float, default=300.0, help=f"a row per this many seconds (a multiple of {ROWS_BUCKET_S:g})"
    )
    args = p.parse_args()
    buckets, summaries = read(args.rows)
    policies = list(buckets)
    every = max(1, round(args.every_s / ROWS_BUCKET_S))
    span = every * ROWS_BUCKET_S
    series = {policy: merged(rows, every) for policy, rows in buckets.items()}
    reached = {policy: len(rows) * ROWS_BUCKET_S for policy, rows in buckets.items()}
    done = [summaries[p] for p in policies if p in summaries]
    text = [markdown_table(SUMMARY_HEADER, done)] if done else []
    cut = [f"{p} reached {reached[p]:g} s (no summary yet)" for p in policies if p not in summaries]
    if cut:
        text.append("Still running or cut short: " + "; ".join(cut) + ".")
    longest = max(series.values(), key=len)
    rows = []
    for i, first in enumerate(longest):
        row: list[object] = [f"{first['start_s']:.0f}", first["active_majors"]]
        for policy in policies:
            if i >= len(series[policy]):
                row += ["-"] * (len(SERIES_HEADER) - 2)
                continue
            b = series[policy][i]
            lanes = [f"{b[k] / (span * 1e9):.0%}" for k in ("load_ns", "exec_ns")]
            row += [f"{b['loads'] / span:.1f}", *lanes, attainment(b["minor"]), attainment(b["major"])]
        rows.append(row)
    header = SERIES_HEADER[:2] + [f"{name} {p}" for p in policies for name in SERIES_HEADER[2:]]
    text.append(f"Over time (per {span:g} s):\n\n" + markdown_table(header, rows))
    print("\n\n".join(text))


if __name__ == "__main__":
    main()
