"""``mainspring analyze`` gives each missed request of a hand-built log its one cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from mainspring.cli import main
from mainspring.telemetry.analyze import analyze, format_analysis, runs
from mainspring.telemetry.recorder import ACTION_COLUMNS, REQUEST_COLUMNS, ActionRow, RequestRow

MS = 1_000_000
ACTIONS = [
    # id, kind, device, model, batch, requests, sent, earliest, latest, expected, status, begin, end, received, message
    ActionRow(1, "load", 0, "cold", 0, 0, 0, 0, 5 * MS, 50 * MS, "ok", 1 * MS, 60 * MS, 61 * MS, ""),
    ActionRow(2, "infer", 0, "cold", 1, 1, 61 * MS, 61 * MS, 62 * MS, 20 * MS, "ok", 61 * MS, 110 * MS, 111 * MS, ""),
    ActionRow(3, "infer", 0, "slow", 1, 1, 0, 0, 1 * MS, 20 * MS, "ok", 0, 130 * MS, 131 * MS, ""),
    ActionRow(4, "infer", 0, "trip", 1, 1, 0, 0, 1 * MS, 99 * MS, "ok", 0, 99 * MS, 103 * MS, ""),
    ActionRow(5, "infer", 0, "late", 1, 1, 0, 90 * MS, 95 * MS, 20 * MS, "ok", 95 * MS, 115 * MS, 116 * MS, ""),
    ActionRow(
        6, "infer", 1, "fine", 1, 1, 0, 0, 1 * MS, 20 * MS, "too_late", -1, -1, 1 * MS, "window closed 0.4 ms before"
    ),
    ActionRow(7, "infer", 1, "fine", 1, 1, 0, 0, 1 * MS, 20 * MS, "ok", 2 * MS, 22 * MS, 23 * MS, ""),
    ActionRow(
        8, "load", 1, "loading", 0, 0, 10 * MS, 10 * MS, 15 * MS, 200 * MS, "ok", 10 * MS, 210 * MS, 211 * MS, ""
    ),
    # loaded long before its request's last chance to start: what held the request was other work
    ActionRow(9, "load", 1, "loaded", 0, 0, 10 * MS, 10 * MS, 15 * MS, 10 * MS, "ok", 10 * MS, 20 * MS, 21 * MS, ""),
    # loaded, then evicted before its request came, and not loaded again in time: it waited for a load
    ActionRow(10, "load", 1, "evicted", 0, 0, 0, 0, 5 * MS, 10 * MS, "ok", 0, 10 * MS, 11 * MS, ""),
    ActionRow(11, "evict", 1, "evicted", 0, 0, 12 * MS, 12 * MS, 3600_000 * MS, 0, "ok", 12 * MS, 12 * MS, 13 * MS, ""),
    ActionRow(
        12, "load", 1, "evicted", 0, 0, 95 * MS, 95 * MS, 100 * MS, 10 * MS, "ok", 95 * MS, 105 * MS, 106 * MS, ""
    ),
]
REQUESTS = [
    RequestRow(1, "fine", 0, 100 * MS, 23 * MS, "success", "", 7, False, "served"),
    RequestRow(2, "cold", 0, 100 * MS, 111 * MS, "success", "", 2, True, "served"),
    RequestRow(3, "slow", 0, 100 * MS, 131 * MS, "success", "", 3, False, "served"),
    RequestRow(4, "trip", 0, 100 * MS, 103 * MS, "success", "", 4, False, "served"),
    RequestRow(5, "late", 0, 100 * MS, 116 * MS, "success", "", 5, False, "served"),
    RequestRow(6, "any", 0, 100 * MS, 0, "rejected", "needs 120 ms", -1, False, "deadline_at_arrival"),
    RequestRow(7, "any", 0, 100 * MS, 0, "rejected", "share", -1, False, "overloaded"),
    RequestRow(8, "loading", 5 * MS, 105 * MS, 80 * MS, "rejected", "expired", -1, False, "expired_in_queue"),
    RequestRow(9, "busy", 0, 100 * MS, 80 * MS, "rejected", "expired", -1, False, "expired_in_queue"),
    RequestRow(10, "any", 0, 100 * MS, 40 * MS, "error", "worker gone", -1, False, "worker_lost"),
    RequestRow(11, "loaded", 5 * MS, 105 * MS, 80 * MS, "rejected", "expired", -1, False, "expired_in_queue"),
    RequestRow(12, "evicted", 20 * MS, 120 * MS, 90 * MS, "rejected", "expired", -1, False, "expired_in_queue"),
]
CAUSES = {
    "served late: waited for its model to load": 1,
    "served late: the batch ran longer than predicted": 1,
    "served late: the answer's way back took the rest": 1,
    "served late: started too late to finish in time": 1,
    "rejected at arrival: the deadline could not be met": 1,
    "rejected at arrival: over its share of the devices (overloaded)": 1,
    "expired in queue: while its model was loading": 1,
    "expired in queue: behind other work": 2,
    "expired in queue: its model held nowhere, no load of it started in time": 1,
    "failed: worker_lost": 1,
}


def write(folder: Path, run: str, requests: list[RequestRow] = REQUESTS, actions: list[ActionRow] = ACTIONS) -> None:
    for name, columns, rows in (("requests", REQUEST_COLUMNS, requests), ("actions", ACTION_COLUMNS, actions)):
        lines = ["\t".join(columns)] + ["\t".join(str(int(v)) if isinstance(v, bool) else str(v) for v in row)
                                         for row in rows]  # fmt: skip
        (folder / f"{run}-{name}.tsv").write_text("\n".join(lines) + "\n")


def test_each_miss_gets_its_cause(tmp_path: Path) -> None:
    write(tmp_path, "hand")
    assert runs(tmp_path) == ["hand"]
    analysis = analyze(tmp_path, "hand")
    assert analysis.requests == 12 and analysis.good == 1 and analysis.missed == 11
    assert {cause: entry.count for cause, entry in analysis.causes.items()} == CAUSES
    assert analysis.refused_actions == {"infer: window closed N ms before": 1}
    assert len(analysis.infer_error_ms) == 5
    # a request served late has no reason of its own: the example says how late, and its batch's time
    slow = analysis.causes["served late: the batch ran longer than predicted"].example
    assert slow == "request 3: answered 31.0 ms after its deadline; its batch of 1 ran 130.0 ms against 20.0 predicted"
    assert analysis.causes["rejected at arrival: the deadline could not be met"].example == "request 6: needs 120 ms"


def test_misses_are_set_beside_the_workers_speed_and_load_over_time(tmp_path: Path) -> None:
    """Two stretches of one model at batch 1: in the second the worker takes twice as long, its lane
    is busier, and the misses are there; the analysis says so."""
    actions, requests = [], []
    for i in range(40):
        second = i >= 20
        start = i * 100 * MS
        duration = (40 if second else 20) * MS
        actions.append(ActionRow(i + 1, "infer", 0, "m", 1, 1, start, start, start + MS, 20 * MS, "ok", start,
                                 start + duration, start + duration, ""))  # fmt: skip
        answered = start + (120 if second and i % 2 else 30) * MS
        requests.append(
            RequestRow(i + 1, "m", start, start + 100 * MS, answered, "success", "", i + 1, False, "served")
        )
    write(tmp_path, "slow", requests, actions)
    analysis = analyze(tmp_path, "slow")
    windows = analysis.windows
    assert len(windows) == 10 and sum(w.requests for w in windows) == 40 and analysis.missed == 10
    assert [round(w.slowdown, 2) for w in windows] == [1.0] * 5 + [2.0] * 5
    assert windows[0].busy == pytest.approx(0.2, abs=0.02) and windows[-1].busy == pytest.approx(0.4, abs=0.02)
    assert sum(w.missed for w in windows[5:]) == 10
    assert "10 of 10 misses fell in the 5 of 10 stretches" in format_analysis(analysis)


def test_the_command_reads_a_folder_of_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "live-20261130-000000")
    assert main(["analyze", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "12 requests, 11 missed the SLO" in out and "expired in queue: while its model was loading" in out
    with pytest.raises(SystemExit):
        main(["analyze", str(tmp_path / "none")])


def test_a_log_cut_short_at_its_end_is_read_and_a_damaged_one_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A server stopped mid-write leaves a partial last line: read without it, and said. A damaged
    line elsewhere, a file of another kind or a value that is no number is an error naming it
    (each was a traceback, or a silent "0 requests")."""
    write(tmp_path, "cut")
    requests = tmp_path / "cut-requests.tsv"
    whole = requests.read_text()
    requests.write_text(whole + "13\tmodel-a\t5")
    assert analyze(tmp_path, "cut").requests == 12
    assert "cut-requests.tsv: its last line (14) is cut short" in caplog.text
    for damaged, message in (
        (
            whole.replace("\n", "\n13\tmodel-a\t5\n", 2),
            "cut-requests.tsv: line 2 does not have the 10 fields of its header",
        ),
        ("garbage\nmore garbage\n", "cut-requests.tsv: not a mainspring log (no column request_id"),
        (whole.replace("\t100000000\t", "\tsoon\t", 1), "invalid literal for int() with base 10: 'soon'"),
    ):
        requests.write_text(damaged)
        with pytest.raises(SystemExit):
            main(["analyze", str(tmp_path)])
        error = capsys.readouterr().err
        assert f"run 'cut' in {tmp_path}" in error and message in error and "Traceback" not in error, error
