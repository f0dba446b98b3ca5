"""The Grafana dashboard asks only for metrics the server exports, and covers what an operator watches."""

from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser as promql

from mainspring.telemetry.metrics import ServingMetrics

DASHBOARDS = Path(__file__).parents[2] / "dashboards"
DASHBOARD = DASHBOARDS / "grafana-mainspring.json"
GRAFANA_RANGES = ("$__rate_interval", "$__interval", "$__range")  # Grafana puts a duration in their place
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


def exported_names() -> set[str]:
    text = ServingMetrics().exposition(0).decode()
    families = re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE)
    return {family + suffix for family in families for suffix in SUFFIXES}


def test_every_query_names_an_exported_metric() -> None:
    document = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    queries = [t["expr"] for panel in document["panels"] for t in panel["targets"]]
    assert len(queries) >= 10
    for query in queries:
        names = set(re.findall(r"\bmainspring_[a-z_]+", query))
        assert names and names <= exported, (query, names - exported)


def test_it_covers_attainment_goodput_rejections_latency_loads_prediction_and_busy() -> None:
    titles = " ".join(panel["title"].lower() for panel in json.loads(DASHBOARD.read_text())["panels"])
    for topic in ("attainment", "goodput", "rejections", "latency", "loads", "prediction error", "busy"):
        assert topic in titles


def test_every_query_of_every_dashboard_parses_as_promql() -> None:
    dashboards = sorted(DASHBOARDS.glob("*.json"))
    assert dashboards
    for dashboard in dashboards:
        for panel in json.loads(dashboard.read_text())["panels"]:
            for target in panel.get("targets", []):
                query = target["expr"]
                for variable in GRAFANA_RANGES:
                    query = query.replace(variable, "5m")
                promql.parse(query)  # raises, naming the fault, on a query Prometheus would refuse
