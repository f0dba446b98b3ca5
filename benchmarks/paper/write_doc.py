"""Join the sections the figure scripts wrote (out/paper/*.md) into docs/paper.md."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from common import OUT

ORDER = ("fig5", "overload", "fig6", "fig7", "fig8", "fragments", "fig9", "fig11", "azure_windows")
HEADER = """# Clockwork's evaluation, reproduced in the simulator

Written by `make paper` (each section by `benchmarks/paper/<figure>.py`, which prints the same table;
plots in `out/paper/*.png`). Every policy of a row ran on the identical arrival sequence: `clockwork`
(ours), the authors' schedulers as we port them, `infer5` (INFER5, which they ran for Figs. 5-8 and
11; `infer5-5ms` with their schedule-ahead of 5 ms for Figs. 7, 8 and 11) and `infer4` (INFER4, which
they ran for Figs. 9-10), and the reactive baselines `triton` and `clipper`. Each section gives the
authors' setting (from their per-figure README in `clockwork-results` and the scripts it names),
ours, every difference, the headline as the paper states it, and where the faithful port falls short;
its plot follows it (`docs/paper/*.png`, copied from `out/paper/`).

**Common to every figure.**
- No GPUs: every duration is Clockwork's published V100 profile (`models/data/clockwork_v100.json`;
  resnet50_v2 is measured, resnet18_v2 and resnet152_v2 partly derived) times the default noise model:
  a log-normal factor exp(N(0, 0.02)), and with probability 1e-4 a spike of U(1.5, 3)x
  (`NoiseModel`, `worker/runtimes/emulated.py`), one seeded generator per device. The schedulers'
  estimates start from the same profile, so prediction is easier than on real GPUs.
- The network takes no time (`SimulationConfig.network_latency_ns` 0; `mainspring simulate
  --network-latency-us` sets it) and no tensors are sent; the authors sent real inputs. INFER5's send
  gate (two actions on the wire) holds an action for the network's latency, so at 0 it never binds;
  the authors' READMEs give their network's bandwidth (10 Gbit), no latency.
- The controller takes no simulated time, except in Fig. 11's second table; theirs was C++ on its
  own machine.
- `triton` and `clipper` are our reactive re-implementations (batches up to 16, a 2 ms queue delay,
  no admission), not the systems; INFaaS is not reproduced.
- The SLO unit: 1x of Figs. 7-8's sweeps in the authors' setting is their README's 2.9 ms
  (`--slo-unit-ms`, the default since 2026-12-06), below our profile's batch-1 time of 3.32 ms for
  resnet50_v2; elsewhere 1x is the profile's batch-1 time. A table measured in the profile's unit is
  14% looser than theirs at every step; each section says which unit its tables use.
- Closed-loop clients wait 10 ms after a rejection; the authors' clients resend at once.
- Runs are minutes long and use one seed (1); the authors ran 10 minutes to 8 hours.
- The paper's headline, "Clockwork can support thousands of models while simultaneously meeting
  100 ms latency targets for ... of requests", has two published readings: 99.997% (the USENIX
  proceedings abstract, OSDI '20, and arXiv v1: 30 misses per million) and 99.9999% (arXiv v2 and
  Microsoft Research's listing: 1 per million). On the 24 day windows below, INFER4 (the authors'
  scheduler for that figure) misses 17-130 per million: within 99.997% in 2 windows (1260/1 and
  1260/3), within 99.9999% in none. Clockwork misses none in any window, within both.
"""


PLOTS = {"fig9": ("fig9", "fig10")}  # a section's plots, when not the one named after it


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/paper.md")
    plots_dir = target.parent / "paper"  # committed beside the page, so a clone sees the plots
    sections = [HEADER]
    for name in ORDER:
        path = OUT / f"{name}.md"
        if not path.exists():
            sections.append(f"## {name}\n\n(not run: `python benchmarks/paper/{name}.py`)\n")
            continue
        text = path.read_text()
        for plot in PLOTS.get(name, (name,)):
            if (OUT / f"{plot}.png").exists():
                plots_dir.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(OUT / f"{plot}.png", plots_dir / f"{plot}.png")
                text += f"\n![{plot}](paper/{plot}.png)\n"
        sections.append(text)
    target.write_text("\n".join(sections))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
