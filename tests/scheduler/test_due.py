"""``DueDevices.any_due`` answers as ``due`` would, and asking it changes nothing ``due`` finds."""

from __future__ import annotations

from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from mainspring.protocol import DeviceSpec
from mainspring.scheduler.clockwork.due import DueDevices, always
from mainspring.scheduler.clockwork.residency import _load_lane
from mainspring.scheduler.clockwork.tracker import DeviceState
from tests.fakes import PAGE

# each step: (device, start of an action planned on its load lane or -1 to complete its oldest,
# its expected duration, how far the limit asked about moves on (time only moves forward, and
# ``due`` relies on that), whether ``any_due`` is asked before ``due``)
_steps = st.lists(
    st.tuples(st.integers(0, 5), st.integers(-1, 400), st.integers(0, 50), st.integers(0, 20), st.booleans()),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(steps=_steps)
def test_any_due_agrees_with_due_and_leaves_what_due_finds_as_a_scan_finds_it(
    steps: list[tuple[int, int, int, int, bool]],
) -> None:
    devices = [DeviceState(DeviceSpec(i, "v100", 8 * PAGE, PAGE), 1_000_000, order=i) for i in range(6)]
    due = DueDevices(_load_lane, always)
    for device in devices:
        device.load_lane.moved = partial(due.moved, device)
        due.moved(device)
    planned: list[list[int]] = [[] for _ in devices]
    action = limit = 0
    for index, start, expected, advance, ask_first in steps:
        limit += advance
        lane = devices[index].load_lane
        if start >= 0:
            action += 1
            lane.plan(action, start, expected)
            planned[index].append(action)
        elif planned[index]:
            lane.complete(planned[index].pop(0), limit)
        scan = [d for d in devices if d.load_lane.free_ns <= limit]
        if ask_first:
            assert due.any_due(limit) == bool(scan)
        assert due.due(limit) == scan
