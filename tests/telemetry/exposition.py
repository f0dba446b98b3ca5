"""Samples of a Prometheus text exposition under the names Prometheus stores them by (the Python client's
parser would rename a counter's samples to ``_total``; Triton's have none)."""

from __future__ import annotations

import math
import re

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \d+)?$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Labels = tuple[tuple[str, str], ...]  # sorted


def samples(text: str) -> dict[str, dict[Labels, float]]:
    """Every sample, by its name, then by its labels."""
    found: dict[str, dict[Labels, float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match is not None, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        key = tuple(sorted(LABEL.findall(labels or "")))
        assert key not in found.setdefault(name, {}), f"{name}{dict(key)} exposed twice"
        found[name][key] = math.nan if value == "NaN" else float(value)
    return found
