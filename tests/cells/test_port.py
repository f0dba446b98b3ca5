"""What the frontends show of several cells: one metrics text with a ``cell`` label."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from mainspring.frontend.cells_port import merge_expositions

CELL_TEXT = """# HELP mainspring_requests_total Requests answered
# TYPE mainspring_requests_total counter
mainspring_requests_total{model="a",outcome="success"} 3.0
mainspring_requests_total{model="odd}name",outcome="success"} 1.0
# HELP mainspring_devices Connected devices
# TYPE mainspring_devices gauge
mainspring_devices 2.0
"""


def test_every_sample_gets_its_cell_and_each_family_stays_whole() -> None:
    merged = merge_expositions([(0, CELL_TEXT.encode()), (1, CELL_TEXT.replace("3.0", "5.0").encode())]).decode()
    families = {f.name: f for f in text_string_to_metric_families(merged)}  # a strict parser reads it
    requests = families["mainspring_requests"].samples
    assert sorted((s.labels["cell"], s.labels["model"], s.value) for s in requests) == [
        ("0", "a", 3.0), ("0", "odd}name", 1.0), ("1", "a", 5.0), ("1", "odd}name", 1.0)
    ]  # fmt: skip
    assert [(s.labels, s.value) for s in families["mainspring_devices"].samples] == [
        ({"cell": "0"}, 2.0), ({"cell": "1"}, 2.0)
    ]  # fmt: skip
    assert merged.count("# TYPE mainspring_devices gauge") == 1


def test_a_cell_with_a_family_the_first_lacks_still_has_its_header() -> None:
    other = "# HELP extra_total An extra\n# TYPE extra_total counter\nextra_total 1.0\n"
    merged = merge_expositions([(0, CELL_TEXT.encode()), (1, other.encode())]).decode()
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    assert [(s.labels, s.value) for s in families["extra"].samples] == [({"cell": "1"}, 1.0)]
