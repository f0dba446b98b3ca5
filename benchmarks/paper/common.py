"""What the paper scripts share: policies side by side, markdown tables, result files.

Each ``figN.py`` prints its table and writes ``out/paper/figN.md`` (a section of
``docs/paper.md``) and its plots; ``make paper`` runs them all and joins the sections.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mainspring.models.profile import ModelProfile, builtin_profiles, model_copies
from mainspring.scheduler.registry import parse_policies
from mainspring.sim.run import SimulationConfig, SimulationResult, Watcher, generate_arrivals, simulate
from mainspring.workload import Arrival, Workload

# INFER5 is the authors' scheduler for Figs. 5-8 and 11 (``infer5-5ms``: their schedule-ahead of 5 ms
# for Figs. 7, 8 and 11), INFER4 for Figs. 9-10.
POLICIES = ("clockwork", "infer5", "infer4", "triton", "clipper")
# Clockwork with a setting changed, run beside the policies under its own name.
VARIANTS: Mapping[str, tuple[str, Mapping[str, object]]] = {
    "clockwork-noguard": ("clockwork", {"guard_tight": False}),  # every device runs whole batches
    "clockwork-by-cost": ("clockwork", {"share_by_cost": True}),  # shares by what a rate costs (cost_shares.py)
    "clockwork-by-wait": ("clockwork", {"replicas_by_wait": True}),  # replicas for turned-away requests (loads.py)
}
OUT = Path(os.environ.get("MAINSPRING_PAPER_OUT", "out/paper"))
# 1x of Figs. 7-8's SLO sweeps in the authors' README; our profile's batch-1 time is 3.32 ms.
AUTHORS_SLO_UNIT_MS = 2.9
PROFILE_SLO_UNIT_MS = 3.32  # resnet50_v2's batch 1 in ``models/data/clockwork_v100.json``, for labels


def add_slo_unit(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--slo-unit-ms",
        type=float,
        default=AUTHORS_SLO_UNIT_MS,
        help=f"1x of the authors' setting's SLO sweep (default {AUTHORS_SLO_UNIT_MS:g}, their README's; 0: the "
        f"profile's batch-1 time, {PROFILE_SLO_UNIT_MS:g} ms)",
    )


def slo_unit(ms: float) -> float | None:
    """``--slo-unit-ms`` as ``SloSweep.unit_ms``: None (0 given) is the profile's batch-1 time."""
    if ms < 0:
        raise SystemExit(f"--slo-unit-ms must not be negative, got {ms:g}")
    return ms or None


def parser(doc: str, policies: Sequence[str] = POLICIES) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--policy", default=",".join(policies))
    p.add_argument("--quick", action="store_true", help="a few seconds per run (a smoke test, not the figure)")
    return p


def copies(model: str, count: int) -> list[ModelProfile]:
    """``count`` copies of one of Clockwork's published V100 profiles."""
    return model_copies([p for p in builtin_profiles() if p.model == model], count)


def resnet50_copies(count: int) -> list[ModelProfile]:
    return copies("resnet50_v2", count)


def policies_from(text: str) -> list[str]:
    """Policy names and ``VARIANTS``, checked."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    parse_policies(",".join(n for n in names if n not in VARIANTS) or "clockwork")
    return names


def run_policy(
    name: str,
    models: Sequence[ModelProfile],
    workload: Workload,
    config: SimulationConfig,
    arrivals: Iterable[Arrival],
    watch: Watcher | None = None,
) -> SimulationResult:
    policy, settings = VARIANTS.get(name, (name, {}))
    return simulate(policy, list(models), workload, config, arrivals, settings=settings or None, watch=watch)


def side_by_side(
    policies: Sequence[str],
    models: Sequence[ModelProfile],
    workload: Workload,
    config: SimulationConfig,
    watch: Callable[[str], Watcher | None] = lambda _policy: None,
) -> dict[str, SimulationResult]:
    """Every policy on the identical arrival sequence; ``watch`` gives a policy's run a ``Watcher``."""
    arrivals = generate_arrivals(workload, list(models), config)
    return {p: run_policy(p, models, workload, config, arrivals, watch(p)) for p in policies}


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_plot(fig: Any, name: str) -> None:
    """``out/paper/<name>.png``."""
    OUT.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(OUT / f"{name}.png", dpi=100)
    pyplot().close(fig)


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
