"""Model profiles: weight size, load time and exec time per batch size on one device kind.

The file format (JSON) is shared by the built-in profiles, by ``mainspring profile``
(which measures a user's own models) and by ``mainspring simulate --profiles``:

    {"format": "mainspring-profiles/1", "source": "...",
     "profiles": [{"model": "resnet50_v2", "device_kind": "v100",
                   "weights_bytes": 102200000, "load_ms": 8.37,
                   "exec_ms": {"1": 3.32, "2": 5.27}, "tensor_bytes": [...]}]}

``tensor_bytes`` is optional; when present, pages are counted by packing the
tensors exactly as the real worker does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from mainspring.protocol.pages import pages_needed
from mainspring.time import ms_to_ns, ns_to_ms

FORMAT = "mainspring-profiles/1"


@dataclass(frozen=True)
class ModelProfile:
    """Measured durations of one model on one device kind."""

    model: str
    device_kind: str
    weights_bytes: int
    load_ns: int
    exec_ns: Mapping[int, int]
    tensor_bytes: tuple[int, ...] = ()
    batch_sizes: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        problems = []
        if self.weights_bytes < 0:
            problems.append(f"weights_bytes={self.weights_bytes} must not be negative")
        if self.load_ns < 0:
            problems.append(f"load_ns={self.load_ns} must not be negative")
        if not self.exec_ns:
            problems.append("exec_ns must name at least one batch size")
        for batch, ns in self.exec_ns.items():
            if batch <= 0 or ns <= 0:
                problems.append(f"exec_ns[{batch}]={ns}: batch size and duration must be positive")
        if problems:
            raise ValueError(f"profile of model {self.model!r}: " + "; ".join(problems))
        object.__setattr__(self, "batch_sizes", tuple(sorted(self.exec_ns)))

    def exec_time_ns(self, batch_size: int) -> int:
        """Exec time of the smallest supported batch that holds ``batch_size`` requests."""
        return self.exec_ns[self.padded_batch(batch_size)]

    def padded_batch(self, batch_size: int) -> int:
        for size in self.batch_sizes:
            if size >= batch_size:
                return size
        raise ValueError(f"model {self.model!r} supports batches up to {self.batch_sizes[-1]}, not {batch_size}")

    def slo_ns_for_factor(self, factor: float) -> int:
        """An SLO given as a multiple of the batch-1 (smallest batch) time, as Clockwork's ``slo_factor``."""
        if not factor > 0:
            raise ValueError(f"SLO factor must be positive, got {factor}")
        return math.ceil(factor * self.exec_ns[self.batch_sizes[0]])

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    def pages(self, page_bytes: int) -> int:
        return pages_needed(self.weights_bytes, page_bytes, self.tensor_bytes)

    @property
    def weightless(self) -> bool:
        """Nothing to page (all it needs is in its graph): resident wherever it is registered, never
        loaded or evicted."""
        return self.weights_bytes == 0 and not self.tensor_bytes

    def renamed(self, model: str) -> ModelProfile:
        """The same measurements under another model name (copies of one model)."""
        return ModelProfile(model, self.device_kind, self.weights_bytes, self.load_ns, self.exec_ns, self.tensor_bytes)

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "model": self.model,
            "device_kind": self.device_kind,
            "weights_bytes": self.weights_bytes,
            "load_ms": ns_to_ms(self.load_ns),
            "exec_ms": {str(b): ns_to_ms(ns) for b, ns in sorted(self.exec_ns.items())},
        }
        if self.tensor_bytes:
            entry["tensor_bytes"] = list(self.tensor_bytes)
        return entry

    @classmethod
    def from_json(cls, entry: Mapping[str, Any], where: str = "profile") -> ModelProfile:
        try:
            return cls(
                model=str(entry["model"]),
                device_kind=str(entry.get("device_kind", "unknown")),
                weights_bytes=int(entry["weights_bytes"]),
                load_ns=ms_to_ns(float(entry["load_ms"])),
                exec_ns={int(b): ms_to_ns(float(ms)) for b, ms in dict(entry["exec_ms"]).items()},
                tensor_bytes=tuple(int(t) for t in entry.get("tensor_bytes", ())),
            )
        except KeyError as missing:
            raise ValueError(f"{where}: missing field {missing}") from None
        except (TypeError, ValueError) as bad:
            raise ValueError(f"{where}: {bad}") from None


def load_profiles(path: str | Path) -> list[ModelProfile]:
    """Read a profile file; errors name the file and the entry."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except OSError as error:
        raise ValueError(f"cannot read profile file {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"profile file {path} is not valid JSON: {error}") from None
    return parse_profiles(document, str(path))


def parse_profiles(document: Any, where: str) -> list[ModelProfile]:
    if not isinstance(document, dict) or not isinstance(document.get("profiles"), list):
        raise ValueError(f"{where}: expected an object with a 'profiles' list")
    return [ModelProfile.from_json(entry, f"{where} profiles[{i}]") for i, entry in enumerate(document["profiles"])]


def dump_profiles(profiles: Iterable[ModelProfile], path: str | Path, source: str) -> None:
    document = {"format": FORMAT, "source": source, "profiles": [p.to_json() for p in profiles]}
    Path(path).write_text(json.dumps(document, indent=2) + "\n")


def builtin_profiles() -> list[ModelProfile]:
    """Clockwork's published V100 measurements (see the data file for sources)."""
    text = resources.files("mainspring.models").joinpath("data/clockwork_v100.json").read_text()
    return parse_profiles(json.loads(text), "built-in profiles")


def model_copies(base: list[ModelProfile], count: int) -> list[ModelProfile]:
    """``count`` models cycling over ``base``: copy i is ``<name>-<i>`` (as Clockwork's experiments)."""
    if count <= 0:
        raise ValueError(f"number of models must be positive, got {count}")
    if not base:
        raise ValueError("no base profiles to copy")
    width = len(str(count - 1))
    return [base[i % len(base)].renamed(f"{base[i % len(base)].model}-{i:0{width}d}") for i in range(count)]
