"""Records every request and action that passes through a controller.

One row per request and per action, kept as plain tuples (a ten-minute replay
holds hundreds of thousands), written out as TSV logs and summarised in reports.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from mainspring.protocol import Action, ActionResult, Infer, LoadWeights, Request, Response, ResponseStatus, action_kind


class RequestRow(NamedTuple):
    request_id: int
    model: str
    arrival_ns: int
    deadline_ns: int
    answered_ns: int
    status: str
    reason: str
    action_id: int  # the Infer that served it; -1 if none
    cold: bool  # served right after a load that ended after it arrived
    outcome: str = ""  # ``Outcome`` value: why it got this answer

    @property
    def latency_ns(self) -> int:
        return self.answered_ns - self.arrival_ns

    @property
    def good(self) -> bool:
        return self.status == ResponseStatus.SUCCESS.value and self.answered_ns <= self.deadline_ns


class ActionRow(NamedTuple):
    action_id: int
    kind: str
    device: int
    model: str
    batch_size: int
    requests: int
    sent_ns: int
    earliest_ns: int
    latest_ns: int
    expected_ns: int
    status: str
    begin_ns: int  # -1 when the action did not run
    end_ns: int
    received_ns: int
    message: str


REQUEST_COLUMNS = RequestRow._fields
ACTION_COLUMNS = ActionRow._fields


@dataclass
class _Sent:
    action: Action
    sent_ns: int


class Recorder:
    """A ``ControllerObserver`` that keeps the request log and the action log."""

    def __init__(self) -> None:
        self.requests: list[RequestRow] = []
        self.actions: list[ActionRow] = []
        self.received = 0
        self._open: dict[int, Request] = {}
        self._sent: dict[int, _Sent] = {}
        self._loaded_end_ns: dict[tuple[int, str], int] = {}
        self._cold: set[int] = set()

    def on_request(self, request: Request, now_ns: int) -> None:
        self.received += 1
        self._open[request.id] = request

    def on_action(self, action: Action, now_ns: int) -> None:
        self._sent[action.action_id] = _Sent(action, now_ns)

    def on_result(self, result: ActionResult, action: Action, now_ns: int) -> None:
        sent = self._sent.pop(action.action_id)
        row = action_row(action, sent.sent_ns, result, now_ns)
        self.actions.append(row)
        if not result.ok:
            return
        if isinstance(action, LoadWeights):
            self._loaded_end_ns[(action.device, action.model)] = row.end_ns
        elif isinstance(action, Infer):
            loaded = self._loaded_end_ns.get((action.device, action.model), -1)
            for request_id in action.request_ids:
                request = self._open.get(request_id)
                if request is not None and loaded > request.arrival_ns:
                    self._cold.add(request_id)

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        self._open.pop(request.id, None)
        cold = request.id in self._cold
        self._cold.discard(request.id)
        self.requests.append(request_row(request, response, now_ns, cold))

    def write_logs(self, directory: Path, prefix: str) -> tuple[Path, Path]:
        """Write ``<prefix>-requests.tsv`` and ``<prefix>-actions.tsv``; returns both paths."""
        directory.mkdir(parents=True, exist_ok=True)
        request_path = directory / f"{prefix}-requests.tsv"
        action_path = directory / f"{prefix}-actions.tsv"
        _write_tsv(request_path, REQUEST_COLUMNS, sorted(self.requests))
        _write_tsv(action_path, ACTION_COLUMNS, sorted(self.actions))
        return request_path, action_path


def action_row(action: Action, sent_ns: int, result: ActionResult, now_ns: int) -> ActionRow:
    """The action log's row of ``action``, sent at ``sent_ns``, as ``result`` reported it at ``now_ns``."""
    timing = result.timing
    begin, end = (timing.begin_ns, timing.end_ns) if timing is not None else (-1, -1)
    batch_size, n_requests = (action.batch_size, len(action.request_ids)) if isinstance(action, Infer) else (0, 0)
    return ActionRow(
        action.action_id, action_kind(action), action.device, action.model, batch_size, n_requests,
        sent_ns, action.earliest_ns, action.latest_ns, action.expected_duration_ns,
        result.status.value, begin, end, now_ns, result.message,
    )  # fmt: skip


def request_row(request: Request, response: Response, now_ns: int, cold: bool) -> RequestRow:
    """The request log's row of ``request``, answered with ``response`` at ``now_ns``."""
    action_id = -1 if response.action_id is None else response.action_id
    return RequestRow(
        request.id, request.model, request.arrival_ns, request.deadline_ns, now_ns,
        response.status.value, response.reason, action_id, cold, response.outcome.value,
    )  # fmt: skip


def as_text(row: RequestRow | ActionRow) -> dict[str, str]:
    """A row as its TSV log has it, read back (what ``mainspring analyze`` works on)."""
    return {column: _cell(value) for column, value in zip(row._fields, row, strict=True)}


def _write_tsv(path: Path, columns: Iterable[str], rows: Iterable[Sequence[object]]) -> None:
    with path.open("w") as handle:
        handle.write("\t".join(columns) + "\n")
        for row in rows:
            handle.write(_line(row))


def _line(row: Sequence[object]) -> str:
    return "\t".join(_cell(v) for v in row) + "\n"


class LogWriter(Recorder):
    """The same two logs, written as rows arrive instead of kept (a live server runs for days):
    ``<prefix>-requests.tsv`` and ``<prefix>-actions.tsv`` in ``directory``."""

    def __init__(self, directory: Path, prefix: str) -> None:
        super().__init__()
        directory.mkdir(parents=True, exist_ok=True)
        self.paths = (directory / f"{prefix}-requests.tsv", directory / f"{prefix}-actions.tsv")
        self._files = [path.open("w", buffering=1 << 16) for path in self.paths]
        for handle, columns in zip(self._files, (REQUEST_COLUMNS, ACTION_COLUMNS), strict=True):
            handle.write("\t".join(columns) + "\n")
        self._flushed_s = time.monotonic()

    def on_result(self, result: ActionResult, action: Action, now_ns: int) -> None:
        super().on_result(result, action, now_ns)
        self._files[1].writelines(_line(row) for row in self.actions)
        self.actions.clear()

    def on_answer(self, request: Request, response: Response, now_ns: int) -> None:
        super().on_answer(request, response, now_ns)
        self._files[0].writelines(_line(row) for row in self.requests)
        self.requests.clear()
        if time.monotonic() - self._flushed_s > 1.0:  # readable while the server runs, a second behind at most
            self.flush()

    def flush(self) -> None:
        for handle in self._files:
            handle.flush()
        self._flushed_s = time.monotonic()

    def close(self) -> None:
        for handle in self._files:
            handle.close()


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value).replace("\t", " ").replace("\n", " ")
