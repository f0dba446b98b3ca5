"""BENCHMARKS.md from ``out/scenarios/results.json`` (written by ``benchmarks/scenarios.py``)."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TITLES = {
    "S1": "S1 tail under load (resnet18 64x64 (the zoo's), Poisson, SLO 10x batch 1)",
    "S2": "S2 bursts at 3x capacity (resnet18 64x64 (the zoo's), 1 s on / 4 s off)",
    "S3": "S3 many models, limited memory (30 resnet18 64x64, Zipf, 10 resident, SLO 100 ms)",
    "S4": "S4 Azure Functions sample at x2 and x6 over the built-in zoo (SLO 100 ms)",
    "S5": "S5 tight SLOs (resnet18 64x64 at 50% of capacity)",
}
META = ("calibration", "runs")


def _span(values: Sequence[float], fmt: str) -> str:
    low, high = min(values), max(values)
    return format(low, fmt) if len(values) == 1 or format(low, fmt) == format(high, fmt) else \
        f"{format(low, fmt)}-{format(high, fmt)}"  # fmt: skip


def _servers(results: dict[str, Any]) -> list[str]:
    order = ["mainspring", "triton-expert", "triton-docs", "ray-expert", "ray-docs"]
    seen = {s for key, points in results.items() if key not in META for runs in points.values() for s in runs}
    return [s for s in order if s in seen]


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(str(c) for c in row) + " |" for row in rows]]  # fmt: skip


def _cell(runs: list[dict[str, Any]] | None) -> str:
    if not runs:
        return "-"
    attainment = _span([100 * r["slo_attainment"] for r in runs], ".2f")
    return f"{attainment}% ({_span([r['goodput_rps'] for r in runs], '.1f')})"


def _ratio(point: dict[str, list[dict[str, Any]]]) -> str:
    """Mainspring's goodput over the best peer's, per repeat (min-max)."""
    ours = point.get("mainspring")
    peers = [runs for server, runs in point.items() if server != "mainspring"]
    if not ours or not peers:
        return "-"
    ratios = []
    for i, run in enumerate(ours):
        best = max((p[i]["goodput_rps"] for p in peers if i < len(p)), default=0.0)
        if best > 0:
            ratios.append(run["goodput_rps"] / best)
    return _span(ratios, ".2f") + "x" if ratios else "inf"


def _smallest_slo(results: dict[str, Any], server: str) -> str:
    held = [runs[server][0]["slo_ms"] for runs in results.get("S5", {}).values()
            if server in runs and min(r["slo_attainment"] for r in runs[server]) >= 0.99]  # fmt: skip
    return f"{min(held):g} ms" if held else "none"


def _details(key: str, points: dict[str, Any], servers: list[str]) -> list[str]:
    header = ["point", "server", "SLO ms", "attainment %", "goodput r/s", "p50 / p99 ms", "rejected", "timed out",
              "errors", "late"]  # fmt: skip
    if key == "S2":
        header.append("recovery median / max ms")
    rows = []
    for label, runs_by_server in points.items():
        for server in servers:
            runs = runs_by_server.get(server)
            if not runs:
                continue
            row = [label, server, f"{runs[0]['slo_ms']:g}", _span([100 * r["slo_attainment"] for r in runs], ".2f"),
                   _span([r["goodput_rps"] for r in runs], ".1f"),
                   f"{_span([r['p50_ms'] for r in runs], '.0f')} / {_span([r['p99_ms'] for r in runs], '.0f')}",
                   _span([r["rejected"] for r in runs], "d"), _span([r["timed_out"] for r in runs], "d"),
                   _span([r["errors"] for r in runs], "d"), _span([r["late"] for r in runs], "d")]  # fmt: skip
            if key == "S2":
                row.append(f"{_span([r['recovery_ms']['median'] for r in runs], '.0f')} / "
                           f"{_span([r['recovery_ms']['max'] for r in runs], '.0f')}")  # fmt: skip
            rows.append(row)
    return _table(header, rows)


def write_markdown(results: dict[str, Any], path: Path) -> None:
    servers = _servers(results)
    runs = results.get("runs", [])
    done = "; ".join(
        f"{r['started']} {r['scenarios']} x{r.get('repeats', 1)} ({r['servers']}) at {r.get('commit', '?')}"
        for r in runs
    )
    cal = results.get("calibration", {})
    lines = [
        "# Mainspring beside Triton and Ray Serve, live on one machine",
        "",
        f"Written by `.venv/bin/python benchmarks/scenarios.py` ({platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; runs, each with its repeats and the commit it ran: {done}). "
        "The peers are installed "
        "by `bash benchmarks/peers/install.sh` into their own environments; their settings and the reason for each "
        "are in the docstrings of `benchmarks/peers/triton_server.py` and `ray_server.py`, the two loading modes "
        "(`docs`: the pattern the peer's documentation shows; `expert`: weights cached in host memory, loads as a "
        "copy, no stalls) in `benchmarks/peers/residency.py`; `-expert` columns are the expert build, `-docs` the "
        "documented pattern, run where loading decides (S3). Every server got the identical arrival sequence per "
        "point, one server at a time, after an 8 s warm-up that is not counted; client, server and worker share "
        "the machine's 2 cores. Cells: SLO attainment (goodput r/s); with repeats, the range over them.",
        "",
        "Capacity (single-threaded forward passes at the largest batch, measured by the script): "
        + "; ".join(
            f"{name}: batch 1 {c['batch1_ms']:.1f} ms, batch {c['max_batch']} {c['max_batch_ms']:.1f} ms, "
            f"{c['capacity_rps']:.1f} r/s"
            for name, c in cal.items()
        )
        + ".",
        "",
        "How the peers behave, by construction (read the figures with this in mind):",
        "",
        "- Triton's queue policy rejects a request whose `timeout` passes while it waits in Triton's queue; "
        "once its batch is handed to the model it runs to the end and may be answered late. A request can only "
        "lower the model's default timeout, so the default is set (60 s): with none, every client timeout is "
        "ignored.",
        "- PyTriton runs each bound model's Python callable behind its own Python-backend stub process (31 "
        "processes for S3's 30 models) and hands tensors over shared memory; Triton itself has no automatic "
        "eviction, so both loading modes bring models in through `residency.py` inside the callable.",
        "- Ray Serve's request path (HTTP proxy actor, replica actor, FastAPI) is Python at every step; on 2 shared "
        "cores its ceiling is S1's closed-loop row, and offered load above it queues until `max_queued_requests` "
        "sheds with 503.",
        "",
        "## Summary",
        "",
    ]
    rows = []
    for key in sorted(k for k in results if k not in META):
        for label, point in results[key].items():
            rows.append([key, label, *[_cell(point.get(s)) for s in servers], _ratio(point)])
    lines += _table(["scenario", "point", *servers, "goodput: mainspring / best peer"], rows)
    if "S5" in results:
        lines += [
            "",
            "S5, the smallest SLO held at 99%: " + ", ".join(f"{s} {_smallest_slo(results, s)}" for s in servers),
        ]
    for key in sorted(k for k in results if k not in META):
        lines += ["", f"## {TITLES.get(key, key)}", "", *_details(key, results[key], servers)]
        plots = sorted((path.parent / "docs" / "scenarios").glob(f"{key}-*/over-time.png"))
        lines += (
            [""] + [f"![{p.parent.name}](docs/scenarios/{p.parent.name}/over-time.png)" for p in plots] if plots else []
        )
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())
