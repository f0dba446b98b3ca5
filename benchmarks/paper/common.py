"""What the paper scripts share: policies side by side, markdown tables, result files.

Each ``figN.py`` prints its table and writes ``out/paper/figN.md`` (a section of
``docs/paper.md``) and its plots; ``make paper`` runs them all and joins the sections.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from mainspring.models.profile import ModelProfile, builtin_profiles, model_copies
from mainspring.sim.run import SimulationConfig, SimulationResult, generate_arrivals, simulate
from mainspring.workload import Workload

POLICIES = ("clockwork", "infer4", "triton", "clipper")
OUT = Path(os.environ.get("MAINSPRING_PAPER_OUT", "out/paper"))


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--policy", default=",".join(POLICIES))
    p.add_argument("--quick", action="store_true", help="a few seconds per run (a smoke test, not the figure)")
    return p


def copies(model: str, count: int) -> list[ModelProfile]:
    """``count`` copies of one of Clockwork's published V100 profiles."""
    return model_copies([p for p in builtin_profiles() if p.model == model], count)


def resnet50_copies(count: int) -> list[ModelProfile]:
    return copies("resnet50_v2", count)


def side_by_side(
    policies: Sequence[str], models: Sequence[ModelProfile], workload: Workload, config: SimulationConfig
) -> dict[str, SimulationResult]:
    """Every policy on the identical arrival sequence."""
    arrivals = generate_arrivals(workload, list(models), config)
    return {p: simulate(p, list(models), workload, config, arrivals) for p in policies}


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(name: str, title: str, setting: str, table: str, notes: str = "") -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    text = f"## {title}\n\n{setting}\n\n{table}\n"
    if notes:
        text += f"\n{notes}\n"
    (OUT / f"{name}.md").write_text(text)
    print(text)
