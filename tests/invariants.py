"""Properties every simulated run must have, whatever the policy."""

from __future__ import annotations

from mainspring.protocol import ResponseStatus
from mainspring.sim.run import SimulationResult


def check_invariants(result: SimulationResult) -> None:
    recorder = result.recorder
    ids = [row.request_id for row in recorder.requests]
    assert len(ids) == len(set(ids)), "a request was answered twice"
    assert len(ids) == recorder.received, "a request was never answered"
    actions = {row.action_id: row for row in recorder.actions}
    for row in recorder.actions:
        if row.status == "ok":
            assert row.earliest_ns <= row.begin_ns <= row.latest_ns, f"action ran outside its window: {row}"
            assert row.begin_ns <= row.end_ns <= row.received_ns
        else:
            assert row.begin_ns == -1, f"a refused action ran: {row}"
    for device in result.devices:
        assert device.peak_used_pages <= device.pool.total_pages, "device memory over capacity"
    for row in recorder.requests:
        assert row.arrival_ns <= row.answered_ns <= result.end_ns, f"answered outside the run: {row}"
        if row.status == ResponseStatus.SUCCESS.value:
            served_by = actions[row.action_id]
            assert served_by.status == "ok" and served_by.kind == "infer", f"success without a batch: {row}"
            assert served_by.end_ns <= row.answered_ns
