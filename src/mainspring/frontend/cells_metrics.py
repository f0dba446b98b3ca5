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
    """The live page's data of every cell that answered (each reply with its cell's index): the cells' views, each
    with its cell and the offset its devices are numbered apart by, and a cursor that holds each cell's."""
    merged: dict[str, Any] = {"seconds": seconds, "views": []}
    cursors = []
    for index, reply in views:
        if not isinstance(reply, dict):
            continue
        cursors.append(f"{index}:{reply['cursor']}")
        offset = index * DEVICE_ID_STRIDE
        merged["views"] += [{**view, "cell": index, "device_offset": offset} for view in reply["views"]]
    merged["cursor"] = ",".join(cursors)
    return merged


def cell_cursors(cursor: str) -> dict[int, str]:
    """Each cell's cursor in a merged view's (``merged_timeline``); what is not one is left out."""
    found = {}
    for part in cursor.split(","):
        index, _, own = part.partition(":")
        if index.isdigit() and own.isdigit():
            found[int(index)] = own
    return found


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
