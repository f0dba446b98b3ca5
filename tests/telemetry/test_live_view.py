"""The live page's data as the controller makes it (``telemetry.timeline``, ``telemetry.live_view``): misses
explained by ``mainspring analyze``'s rules, what a cursor leaves out, where models are held, bounded memory;
and the cells' views merged (``frontend.cells_metrics``)."""

from __future__ import annotations

from mainspring.frontend.cells_metrics import cell_cursors, merged_timeline
from mainspring.models.profile import ModelProfile
from mainspring.protocol import ActionResult, DeviceSpec, EvictWeights, Infer, LoadWeights, Outcome, Request, Response
from mainspring.protocol.results import ActionStatus, Timing
from mainspring.telemetry.live_view import ANSWER_COLUMNS, ModelWindow, horizon_since, page_view
from mainspring.telemetry.timeline import Timeline
from mainspring.time import NS_PER_MS, NS_PER_S

MS = NS_PER_MS
PROFILE = ModelProfile("m", "v100", 3 * 16 * 1024 * 1024, 5 * MS, {1: 2 * MS})


def request(request_id: int, arrival_ms: float, slo_ms: float = 10.0) -> Request:
    arrival = round(arrival_ms * MS)
    return Request(request_id, "m", arrival, arrival + round(slo_ms * MS), round(slo_ms * MS), arrival)


def observe(observers: tuple[Timeline, ModelWindow], *events: tuple[str, object, object, float]) -> None:
    """Each event to every observer, as the controller tells them: (what, object, its result or answer, at ms)."""
    for what, first, second, at_ms in events:
        now = round(at_ms * MS)
        for observer in observers:
            if what == "action":
                observer.on_action(first, now)  # type: ignore[arg-type]
            elif what == "result":
                observer.on_result(second, first, now)  # type: ignore[arg-type]
            else:
                observer.on_answer(first, second, now)  # type: ignore[arg-type]


def test_a_late_answer_is_explained_as_analyze_explains_it() -> None:
    timeline, window = Timeline(), ModelWindow()
    timeline.add_device(0, (), 0)
    window.watched(0)  # a page is open
    load = LoadWeights(1, 0, "m", 0, 1 * MS, 5 * MS)
    cold = request(1, 1.0)  # arrives while its model loads, served after it: late
    slow = Infer(2, 0, "m", 6 * MS, 7 * MS, 2 * MS, (1,), 1)
    rejected = request(2, 20.0, slo_ms=0.01)
    on_time = request(3, 30.0)
    fast = Infer(3, 0, "m", 31 * MS, 32 * MS, 2 * MS, (3,), 1)
    observe(
        (timeline, window),
        ("action", load, None, 0.0),
        ("result", load, ActionResult(1, 0, ActionStatus.OK, Timing(0, 5 * MS)), 5.0),
        ("action", slow, None, 5.5),
        ("result", slow, ActionResult(2, 0, ActionStatus.OK, Timing(6 * MS, 14 * MS)), 14.0),  # 8 ms, 2 predicted
        ("answer", cold, Response(1, Outcome.SERVED, "", 2), 14.5),
        ("answer", rejected, Response(2, Outcome.DEADLINE_AT_ARRIVAL, "deadline cannot be met"), 20.0),
        ("action", fast, None, 30.5),
        ("result", fast, ActionResult(3, 0, ActionStatus.OK, Timing(31 * MS, 33 * MS)), 33.0),
        ("answer", on_time, Response(3, Outcome.SERVED, "", 3), 33.5),
    )
    view = timeline.view(34 * MS, 0, [0])
    late, refused = view["explained"][1], view["explained"][0]  # the latest first; the one on time is no miss
    assert len(view["explained"]) == 2
    assert (late["request_id"], late["outcome"], late["cause"]) == (
        1,
        "late",
        "served late: waited for its model to load",
    )
    assert late["detail"] == "answered 3.5 ms after its deadline; its batch of 1 ran 8.0 ms against 2.0 predicted"
    assert refused["cause"] == "rejected at arrival: the deadline could not be met"
    assert refused["detail"] == "deadline cannot be met"
    assert timeline.view(40 * NS_PER_S, 0, [0])["explained"] == []  # past the 30 s kept: their actions are forgotten
    # Where each ran against where it was predicted to (from when it could start, for its expected time).
    assert [(a.kind, a.status, a.begin_ns, a.end_ns, a.earliest_ns, a.expected_ns) for a in view["actions"]] == [
        ("load", "ok", 0, 5 * MS, 0, 5 * MS), ("infer", "ok", 6 * MS, 14 * MS, 6 * MS, 2 * MS),
        ("infer", "ok", 31 * MS, 33 * MS, 31 * MS, 2 * MS),
    ]  # fmt: skip
    answers = [dict(zip(ANSWER_COLUMNS, row, strict=True)) for row in window.since(0)]
    assert [(a["model"], a["met"], a["outcome"]) for a in answers] == [
        ("m", False, ""), ("m", False, "deadline_at_arrival"), ("m", True, "")
    ]  # fmt: skip
    assert answers[2]["latency_ns"] == round(3.5 * MS)


def test_a_cursor_leaves_out_what_an_earlier_poll_had_and_memory_stays_bounded() -> None:
    timeline, window = Timeline(max_items=10), ModelWindow(max_answers=10)
    timeline.add_device(0, (), 0)
    window.watched(0)
    for i in range(100):
        infer = Infer(i, 0, "m", i * MS, i * MS + MS, MS, (i,), 1)
        observe(
            (timeline, window),
            ("action", infer, None, i),
            ("result", infer, ActionResult(i, 0, ActionStatus.OK, Timing(i * MS, i * MS + MS // 2)), i + 0.5),
            ("answer", request(i, i), Response(i, Outcome.SERVED, "", i), i + 0.6),
        )
    every = timeline.view(100 * MS, 0, [0])
    assert [a.action_id for a in every["actions"]] == list(range(90, 100)) and len(window.since(0)) == 10
    since = horizon_since(100 * MS, 30.0, str(round(97.9 * MS)))
    assert since == round(97.9 * MS) and horizon_since(100 * MS, 0.001, "97") == 99 * MS  # the later of the two
    assert horizon_since(40 * NS_PER_S, 30.0, "not one") == 10 * NS_PER_S
    assert horizon_since(40 * NS_PER_S, 30.0, str(50 * NS_PER_S)) == 10 * NS_PER_S  # another clock's: a new window
    assert [a.action_id for a in timeline.view(100 * MS, since, [0])["actions"]] == [98, 99]
    assert [row[0] for row in window.since(since)] == [round(98.6 * MS), round(99.6 * MS)]
    assert timeline.view(100 * MS, 100 * MS, [0])["actions"] == [] and window.since(100 * MS) == []


def test_where_models_are_held_and_each_pool_used() -> None:
    timeline, window = Timeline(), ModelWindow()
    timeline.add_device(0, ("m",), 0)  # a worker that rejoined holding it
    timeline.add_device(1, (), 0)
    spec = DeviceSpec(0, pool_bytes=16 * 16 * 1024 * 1024, page_bytes=16 * 1024 * 1024)
    specs = {0: spec, 1: DeviceSpec(1, pool_bytes=spec.pool_bytes, page_bytes=spec.page_bytes)}
    load = LoadWeights(1, 1, "m", 0, MS, 5 * MS)
    evict = EvictWeights(2, 0, "m", 0, MS, 0)
    observe((timeline, window), ("action", load, None, 0.0),
            ("result", load, ActionResult(1, 1, ActionStatus.OK, Timing(0, 5 * MS)), 5.0),
            ("action", evict, None, 6.0))  # fmt: skip
    served = {"m": ("m-name", PROFILE, 100.0)}
    view = page_view(timeline, window, 7 * MS, 0, served, specs, loop_lag_ns=1_500_000, last_used={"m": 3 * MS})
    assert view["pools"] == [
        {"device": 0, "kind": "v100", "total_pages": 16, "used_pages": 0, "models": []},  # gone: its eviction sent
        {"device": 1, "kind": "v100", "total_pages": 16, "used_pages": 3, "models": ["m"]},
    ]  # fmt: skip
    assert view["models"] == [{"key": "m", "model": "m-name", "slo_ms": 100.0}] and view["loop_lag_ms"] == 1.5
    assert view["last_used_ns"] == {"m": 3 * MS}
    assert [(a.kind, a.status) for a in view["in_flight"]] == [("evict", "in_flight")] and view["devices"] == [0, 1]
    timeline.remove_device(1)
    assert page_view(timeline, window, 8 * MS, 0, served, specs, 0, {})["pools"][1]["models"] == []


def test_answers_are_kept_only_while_a_page_polls_and_the_view_says_from_when() -> None:
    window = ModelWindow(horizon_s=1.0, max_answers=3)
    answer = Response(1, Outcome.SERVED, "", 1)
    window.on_answer(request(1, 0.0), answer, 1 * MS)  # no page yet: not kept
    first = page_view(Timeline(), window, 2 * MS, 0, {}, {}, 0, {})  # a page's first poll
    assert first["answers_from_ns"] == 2 * MS  # the page's rates count from here, not over the whole window
    window.on_answer(request(2, 2.0), answer, 3 * MS)
    window.on_answer(request(3, 2.0), answer, 2 * MS + NS_PER_S)  # the last within the horizon of that poll
    window.on_answer(request(4, 2.0), answer, 3 * MS + NS_PER_S)  # the page is gone: not kept
    assert [row[0] for row in window.since(0)] == [3 * MS, 2 * MS + NS_PER_S]
    later = 5 * NS_PER_S  # a page back after a break (a hidden tab's timers slowed): complete only from now
    assert page_view(Timeline(), window, later, 0, {}, {}, 0, {})["answers_from_ns"] == later
    for i in range(4):
        window.on_answer(request(5 + i, 0.0), answer, later + i * MS)
    assert page_view(Timeline(), window, later + 9 * MS, 0, {}, {}, 0, {})["answers_from_ns"] == later + MS  # full


def test_a_lost_devices_actions_in_flight_are_forgotten() -> None:
    timeline = Timeline()
    timeline.add_device(1, (), 0)
    timeline.on_action(Infer(1, 1, "m", MS, 2 * MS, MS, (1,), 1), 0)
    assert len(timeline.view(MS, 0, [1])["in_flight"]) == 1
    timeline.remove_device(1)  # no result will come for it
    assert timeline.view(MS, 0, [])["in_flight"] == []


def test_a_model_held_from_before_the_rows_kept_is_not_explained_as_held_nowhere() -> None:
    timeline, window = Timeline(), ModelWindow()
    timeline.add_device(0, ("m",), 0)  # holds it throughout: no load of it among the rows
    timeline.add_device(1, (), 0)
    load, evict = LoadWeights(1, 1, "m", 0, MS, 5 * MS), EvictWeights(2, 1, "m", 6 * MS, 7 * MS, 0)
    expired = request(1, 8.0)
    observe(
        (timeline, window),
        ("action", load, None, 0.0),
        ("result", load, ActionResult(1, 1, ActionStatus.OK, Timing(0, 5 * MS)), 5.0),
        ("action", evict, None, 6.0),
        ("result", evict, ActionResult(2, 1, ActionStatus.OK, Timing(6 * MS, 6 * MS)), 6.0),
        ("answer", expired, Response(1, Outcome.EXPIRED_IN_QUEUE, "expired"), 18.0),
    )
    (explained,) = timeline.view(20 * MS, 0, [0, 1])["explained"]
    assert explained["cause"] == "expired in queue: behind other work"


def test_the_cells_views_merged_and_their_cursors_given_back() -> None:
    one = {"seconds": 30.0, "cursor": "111", "views": [{"devices": [0], "loop_lag_ms": 1.0}]}
    two = {"seconds": 30.0, "cursor": "222", "views": [{"devices": [0], "loop_lag_ms": 2.0}]}
    merged = merged_timeline(30.0, [(0, one), (1, RuntimeError("gone")), (2, two)])
    assert merged["cursor"] == "0:111,2:222" and cell_cursors(merged["cursor"]) == {0: "111", 2: "222"}
    assert [(v["cell"], v["device_offset"], v["loop_lag_ms"]) for v in merged["views"]] == [(0, 0, 1.0), (2, 2000, 2.0)]
    assert cell_cursors("") == {} and cell_cursors("1:x,:2,3:4") == {3: "4"}
