"""Join the sections the figure scripts wrote (out/paper/*.md) into docs/paper.md."""

from __future__ import annotations

import sys
from pathlib import Path

from common import OUT

ORDER = ("fig5", "overload", "fig6", "fig7", "fig8", "fig9", "fig11", "azure_windows")
HEADER = """# Clockwork's evaluation, reproduced in the simulator

Written by `make paper` (each section by `benchmarks/paper/<figure>.py`, which prints the same table).
Every policy of a row ran on the identical arrival sequence: `clockwork` (ours), `infer4` (Clockwork's
INFER4 as published, `src/mainspring/scheduler/infer4/`), and the reactive baselines `triton` and `clipper`.
The authors ran INFER5 for Figs. 5-8 and 11 and INFER4 for Figs. 9-10; INFER5 is ported (`--policy infer5`,
`src/mainspring/scheduler/infer5/`), but the sections below do not run it yet.
Durations come from Clockwork's published V100 profiles times the default noise model; the settings of
each figure are in its section. Where the paper gives a number for a figure, the section quotes it;
most of its figures are plots without a table. Plots: `out/paper/*.png`.
"""


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/paper.md")
    sections = [HEADER]
    for name in ORDER:
        path = OUT / f"{name}.md"
        if path.exists():
            sections.append(path.read_text())
        else:
            sections.append(f"## {name}\n\n(not run: `python benchmarks/paper/{name}.py`)\n")
    target.write_text("\n".join(sections))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
