"""Replay of the Azure Functions 2019 invocation trace (per-minute counts).

Mapping onto models follows Clockwork: sort functions by total invocations,
descending; function ``i`` feeds model ``floor(n_models * i / n_functions)``;
within each minute arrivals are Poisson at ``count x scale``.

When there are fewer functions than models (the bundled sample has 900), function
``i`` instead feeds the block of models ``[floor(M*i/F), floor(M*(i+1)/F))``, so
that every model receives traffic; within its block an arrival picks a model with
Zipf(1) weights, so popularity stays skewed inside blocks as well as between them.
With at least as many functions as models the block is the single Clockwork model.
``AzureTrace(authors_mapping=True)`` keeps the authors' mapping whatever the counts: with fewer functions
than models, the models no function maps to get no traffic.
"""

from __future__ import annotations

import csv
import functools
import io
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from mainspring.models.profile import ModelProfile
from mainspring.time import NS_PER_S
from mainspring.workload.base import MAX_ARRIVALS, Arrival, Workload

MINUTES_PER_DAY = 1440
NS_PER_MINUTE = 60 * NS_PER_S
BUNDLED_TRACE = "azure-functions-2019-sample.csv"
MAX_TRACE_BYTES = 1 << 30  # 1 GiB: a day of the full trace (~46,000 functions x 1440 minutes) is far less
MAX_COUNT = 10_000_000  # invocations of one function in one minute: 170,000 r/s


def bundled_trace_path() -> Path:
    """The 900-function sample shipped in the package (source: see docs/workloads.md)."""
    return Path(str(resources.files("mainspring.workload").joinpath(f"data/{BUNDLED_TRACE}")))


def read_trace(path: str | Path) -> list[list[int]]:
    """Per-function lists of invocations per minute, in file order.

    Accepts both headers: ``HashFunction,HashOwner,HashApp,minute_1..`` (the sample)
    and ``HashOwner,HashApp,HashFunction,Trigger,1..1440`` (the original trace). Every error names
    the file and, past the header, the line; a file over ``MAX_TRACE_BYTES`` is refused unread.
    """
    path = Path(path)
    rows = _csv_rows(path)
    if not rows:
        raise ValueError(f"trace file {path} is empty")
    header = rows[0]
    first_minute = next((i for i, name in enumerate(header) if name in ("minute_1", "1")), None)
    if first_minute is None:
        raise ValueError(f"trace file {path}: header has no 'minute_1' (or '1') column; got {header[:6]}")
    functions = []
    for line, row in enumerate(rows[1:], start=2):
        if row:
            functions.append(_counts(row[first_minute:], f"trace file {path}, line {line}"))
    if not functions:
        raise ValueError(f"trace file {path} has no functions")
    return functions


@functools.cache
def _bundled_functions() -> list[list[int]]:
    """The bundled sample, read once a process (half a second; ``plan`` reads it for each what-if)."""
    return read_trace(bundled_trace_path())


def _csv_rows(path: Path) -> list[list[str]]:
    """The file's CSV rows, told as a ``ValueError`` naming the file (and line) where it is no CSV text."""
    try:
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise ValueError(f"trace file {path} is {size:,} bytes; a trace may be at most {MAX_TRACE_BYTES:,}")
        data = path.read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read trace file {path}: {error.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(f"trace file {path}, line {line}: not UTF-8 text (a trace is a CSV file)") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return list(reader)
    except csv.Error as error:  # a NUL byte, a field past the csv module's limit
        raise ValueError(f"trace file {path}, line {reader.line_num + 1}: not CSV text ({error})") from None


def _counts(cells: list[str], where: str) -> list[int]:
    """One function's invocations per minute; an empty cell is none."""
    try:
        values = [float(v) if v else 0.0 for v in cells]
    except ValueError:
        raise ValueError(f"{where}: invocation counts must be numbers") from None
    bad = next((v for v in values if not 0 <= v <= MAX_COUNT), None)  # NaN fails the comparison too
    if bad is not None:
        raise ValueError(f"{where}: invocation count {bad:g} is not in [0, {MAX_COUNT:,}] a minute")
    return [int(v) for v in values]


def model_blocks(n_functions: int, n_models: int, authors: bool = False) -> list[range]:
    """The models each function (by popularity rank) feeds; see the module docstring (``authors``: the single
    model of Clockwork's mapping, also with fewer functions than models)."""
    blocks = []
    for i in range(n_functions):
        start = n_models * i // n_functions
        stop = start + 1 if authors else n_models * (i + 1) // n_functions
        blocks.append(range(start, max(stop, start + 1)))
    return blocks


@dataclass
class AzureTrace(Workload):
    """Replay ``trace`` (path; None for the bundled sample) from ``start_minute`` at ``scale``;
    with ``ramp_to``, the scale grows linearly from ``scale`` to ``ramp_to`` over the run
    (Clockwork's Fig. 11 load ramp)."""

    trace: str | Path | None = None
    scale: float = 1.0
    start_minute: int = 0
    ramp_to: float | None = None
    authors_mapping: bool = False  # Clockwork's: a function feeds one model, also with fewer functions than models
    name = "azure"
    _functions: list[list[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.scale > 0 or (self.ramp_to is not None and not self.ramp_to > 0):
            raise ValueError(f"trace scale must be positive, got {self.scale} (ramp to {self.ramp_to})")
        if not 0 <= self.start_minute < MINUTES_PER_DAY:
            raise ValueError(f"start minute must be in [0, {MINUTES_PER_DAY}), got {self.start_minute}")
        functions = read_trace(self.trace) if self.trace is not None else _bundled_functions()
        totals = [sum(counts) for counts in functions]
        order = sorted(range(len(functions)), key=lambda i: (-totals[i], i))
        self._functions = [functions[i] for i in order]

    @property
    def n_functions(self) -> int:
        return len(self._functions)

    def arrivals(self, models: Sequence[ModelProfile], duration_ns: int, rng: random.Random) -> Iterator[Arrival]:
        names = [m.model for m in models]
        blocks = model_blocks(self.n_functions, len(names), self.authors_mapping)
        generator = np.random.default_rng(rng.getrandbits(64))
        minutes = -(-duration_ns // NS_PER_MINUTE)
        for minute in range(minutes):
            column = self.start_minute + minute
            start_ns = minute * NS_PER_MINUTE
            peak = max(self.scale_at(start_ns, duration_ns), self.scale_at(start_ns + NS_PER_MINUTE, duration_ns))
            times, targets = [], []
            for function, block in zip(self._functions, blocks, strict=True):
                count = function[column] if column < len(function) else 0
                if count == 0:
                    continue
                if count * peak > MAX_ARRIVALS:  # one draw would fill the memory before any limit is checked
                    raise ValueError(f"the trace at scale {peak:g} asks for {count * peak:.3g} requests in one minute "
                                     f"of one function, more than a run holds ({MAX_ARRIVALS:,})")  # fmt: skip
                n = int(generator.poisson(count * peak))
                if n == 0:
                    continue
                times.append(generator.uniform(0, NS_PER_MINUTE, n).astype(np.int64) + start_ns)
                targets.append(_pick_in_block(block, n, generator))
            if not times:
                continue
            all_times = np.concatenate(times)
            all_targets = np.concatenate(targets)
            if self.ramp_to is not None:  # thinning: keep an arrival with the ramp's scale at its time
                keep = generator.uniform(0, peak, all_times.size) < self.scale_at_array(all_times, duration_ns)
                all_times, all_targets = all_times[keep], all_targets[keep]
            order = np.argsort(all_times, kind="stable")
            for t, m in zip(all_times[order].tolist(), all_targets[order].tolist(), strict=True):
                if t >= duration_ns:
                    return
                yield Arrival(t, names[m])

    def expected_arrivals(self, models: int, duration_ns: int) -> float:
        whole, rest = divmod(duration_ns, NS_PER_MINUTE)  # the last minute is cut where the run ends
        first, last = self.start_minute, self.start_minute + whole
        invocations = sum(sum(c[first:last]) + (c[last] * rest / NS_PER_MINUTE if last < len(c) else 0)
                          for c in self._functions)  # fmt: skip
        return float(invocations) * max(self.scale, self.ramp_to or 0.0)

    def scale_at(self, time_ns: int, duration_ns: int) -> float:
        """The scale at ``time_ns`` of a run of ``duration_ns`` (linear from ``scale`` to ``ramp_to``)."""
        if self.ramp_to is None:
            return self.scale
        return self.scale + (self.ramp_to - self.scale) * min(time_ns, duration_ns) / max(duration_ns, 1)

    def scale_at_array(self, times_ns: np.ndarray, duration_ns: int) -> np.ndarray:
        assert self.ramp_to is not None
        fraction = np.minimum(times_ns, duration_ns) / max(duration_ns, 1)
        return np.asarray(self.scale + (self.ramp_to - self.scale) * fraction, dtype=np.float64)

    def describe(self) -> str:
        scale = f"x{self.scale:g}" + (f"..x{self.ramp_to:g}" if self.ramp_to is not None else "")
        return f"azure trace ({self.n_functions} functions) {scale} from minute {self.start_minute}"


def _pick_in_block(block: range, n: int, generator: np.random.Generator) -> np.ndarray:
    if len(block) == 1:
        return np.full(n, block.start, dtype=np.int64)
    weights = 1.0 / np.arange(1, len(block) + 1)
    return block.start + generator.choice(len(block), size=n, p=weights / weights.sum())
