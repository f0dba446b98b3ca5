"""What the cells report, as one server's: Prometheus metrics with a ``cell`` label, statistics summed, the
live page's devices numbered apart (``CellsPort``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mainspring.telemetry.metrics import ModelStats

DEVICE_ID_STRIDE = 1000  # the live page shows cell i's device d as i * this + d


def summed_statistics(stats: Sequence[ModelStats | BaseException]) -> ModelStats:
    """One model's statistics over the cells that answered (the first error if none did)."""
    found = [s for s in stats if isinstance(s, ModelStats)]
    if not found:
        raise next(s for s in stats if isinstance(s, BaseException))
    total = ModelStats()
    for one in found:
        for field in ("success_count", "success_ns", "fail_count", "fail_ns", "rejected_count",
                      "execution_count", "inference_count"):  # fmt: skip
            setattr(total, field, getattr(total, field) + getattr(one, field))
        total.last_inference_ns = max(total.last_inference_ns, one.last_inference_ns)
    return total


def merged_timeline(seconds: float, views: Sequence[tuple[int, object]]) -> dict[str, Any]:
    """The live page's data of every cell that answered (each view with its cell's index): devices numbered
    apart, each model's row and each miss with its cell, the loop lag per cell and the worst as the server's."""
    merged: dict[str, Any] = {"seconds": seconds, "devices": [], "actions": [], "misses": [], "explained": []}
    merged |= {"models": [], "pools": [], "loop_lag_ms": 0.0, "cells": []}
    for index, view in views:
        if not isinstance(view, dict):
            continue
        offset = index * DEVICE_ID_STRIDE
        merged["devices"] += [offset + d for d in view["devices"]]
        merged["actions"] += [{**a, "device": offset + a["device"], "cell": index} for a in view["actions"]]
        for part in ("misses", "explained"):
            merged[part] += [{**m, "cell": index} for m in view[part]]
        for model in view["models"]:
            merged["models"].append({**model, "cell": index, "resident": [offset + d for d in model["resident"]]})
        merged["pools"] += [{**p, "device": offset + p["device"], "cell": index} for p in view["pools"]]
        merged["cells"].append({"cell": index, "loop_lag_ms": view["loop_lag_ms"], "devices": len(view["devices"])})
        merged["loop_lag_ms"] = max(merged["loop_lag_ms"], view["loop_lag_ms"])
    merged["explained"].sort(key=lambda m: -m["at_ms"])  # the latest first, as each cell's
    return merged


def merge_expositions(texts: Sequence[tuple[int, bytes]]) -> bytes:
    """Prometheus text from several cells as one: each sample gains ``cell="<index>"``, every family's
    samples stay together under one HELP and TYPE (the first cell's)."""
    headers: dict[str, list[str]] = {}
    header_from: dict[str, int] = {}
    samples: dict[str, list[str]] = {}
    for index, text in texts:
        family = ""
        for line in text.decode().splitlines():
            if line.startswith("# "):
                parts = line.split(" ", 3)
                family = parts[2] if len(parts) > 2 else family
                if header_from.setdefault(family, index) == index:  # the first cell that has it
                    headers.setdefault(family, []).append(line)
                samples.setdefault(family, [])
            elif line.strip():
                samples.setdefault(family, []).append(_with_cell(line, index))
    lines: list[str] = []
    for family, rows in samples.items():
        lines += headers.get(family, [])
        lines += rows
    return ("\n".join(lines) + "\n").encode()


def _with_cell(line: str, cell: int) -> str:
    """``line`` (one sample) with the label ``cell`` first."""
    brace, space = line.find("{"), line.find(" ")
    if brace < 0 or 0 <= space < brace:  # no labels
        end = space if space >= 0 else len(line)
        return f'{line[:end]}{{cell="{cell}"}}{line[end:]}'
    close = _closing_brace(line, brace)
    inside = line[brace + 1 : close]
    labels = f'cell="{cell}"' + (f",{inside}" if inside else "")
    return f"{line[:brace]}{{{labels}}}{line[close + 1 :]}"


def _closing_brace(line: str, start: int) -> int:
    """The ``}`` that ends the label set opened at ``start`` (a label value may hold one, quoted)."""
    quoted = escaped = False
    for i in range(start + 1, len(line)):
        char = line[i]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "}" and not quoted:
            return i
    return len(line)
