"""Triton's published Grafana dashboard (vendored, ``tests/data/triton_dashboard/README.md``) pointed at a running
``mainspring serve``: every metric its queries name is on ``/metrics`` with the labels they group by, and has
data. Its queries are parsed as Prometheus parses them (``promql-parser``), not matched by pattern."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import promql_parser as promql
import pytest

from tests.serving.processes import ServerProcess, http_call
from tests.telemetry.exposition import samples
from tests.waiting import wait_for

DASHBOARD = Path(__file__).parents[1] / "data" / "triton_dashboard" / "dashboard.json"
# Labels Prometheus puts on every series it scrapes (instance), and Kubernetes discovery in Triton's chart (pod):
# the server never writes them.
SCRAPE_LABELS = {"instance", "pod"}
GPU_PREFIX = "nv_gpu_"  # per GPU: exposed only where a worker has one
SERVED = {"nv_inference_count", "nv_inference_request_success", "nv_inference_compute_infer_duration_us",
          "nv_inference_queue_duration_us"}  # fmt: skip  # above zero once requests are served


def queries(dashboard: Path) -> list[tuple[str, str]]:
    """Every panel's ``(expr, legendFormat)``."""
    document = json.loads(dashboard.read_text())
    return [(t["expr"], t.get("legendFormat", "")) for p in document["panels"] for t in p.get("targets", [])]


def children(expr: object) -> list[object]:
    if isinstance(expr, promql.AggregateExpr):
        return [expr.expr] + ([expr.param] if expr.param is not None else [])
    if isinstance(expr, promql.BinaryExpr):
        return [expr.lhs, expr.rhs]
    if isinstance(expr, promql.Call):
        return list(expr.args)
    if isinstance(expr, promql.MatrixSelector):
        return [expr.vector_selector]
    if isinstance(expr, promql.ParenExpr | promql.UnaryExpr | promql.SubqueryExpr):
        return [expr.expr]
    return []


def grouped_by(expr: object) -> set[str]:
    """The labels ``expr`` itself groups or matches by: ``by (...)``, ``on (...)`` (not ``without``, ``ignoring``)."""
    if isinstance(expr, promql.AggregateExpr):
        modifier = expr.modifier
        return set(modifier.labels) if modifier is not None and modifier.type == promql.AggModifierType.By else set()
    if isinstance(expr, promql.BinaryExpr) and expr.modifier is not None:
        matching = expr.modifier.matching
        return (
            set(matching.labels)
            if matching is not None and matching.type == promql.LabelModifierType.Include
            else set()
        )
    return set()


def needed(expr: object, around: frozenset[str] = frozenset()) -> Iterator[tuple[str, frozenset[str]]]:
    """Each metric ``expr`` selects, with the labels the expressions around it group by."""
    labels = around | grouped_by(expr)
    if isinstance(expr, promql.VectorSelector):
        assert expr.name, f"a selector without a metric name: {expr}"
        yield expr.name, labels
    for child in children(expr):
        yield from needed(child, labels)


def dashboard_needs(dashboard: Path) -> dict[str, set[str]]:
    """Metric -> the labels the dashboard groups it by or names in a legend."""
    needs: dict[str, set[str]] = {}
    for expr, legend in queries(dashboard):
        legend_labels = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
        for metric, labels in needed(promql.parse(expr)):
            needs.setdefault(metric, set()).update(labels | legend_labels)
    return needs


def test_the_dashboard_is_parsed_into_the_metrics_and_labels_it_queries() -> None:
    needs = dashboard_needs(DASHBOARD)
    assert needs["nv_inference_compute_infer_duration_us"] == {"model"}  # sum(rate(...)) by (model)
    assert needs["nv_inference_count"] == {"instance", "pod"}
    assert needs["nv_gpu_memory_used_bytes"] == {"gpu_uuid"}  # its legend, "GPU {{gpu_uuid}}"
    assert len(needs) == 10 and all(name.startswith("nv_") for name in needs)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """``mainspring serve`` with two frontend processes (``/metrics`` comes from the controller through one of
    them) and a worker of two emulated devices serving two models; 60 requests served."""
    (tmp_path / "repo").mkdir()
    process = ServerProcess(tmp_path / "repo", tmp_path / "server.log", "--workers", "tcp", "--allow-open-workers",
                            "--frontends", "2", "--slo-ms", "30000",
                            env={"MAINSPRING_WORKER_TIMEOUT_S": "60"})  # fmt: skip  # a busy machine loses no worker
    command = [sys.executable, "-m", "mainspring.cli", "worker", "--controller", process.worker_address,
               "--emulate", "--count", "2", "--models", "2", "--name", "emulated"]  # fmt: skip
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        process.wait_ready()
        status, index = http_call(f"http://{process.http}/v2/repository/index", b"{}")
        models = sorted(entry["name"] for entry in json.loads(index))
        assert status == 200 and len(models) == 2, index

        def ask(i: int) -> int:
            body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4],
                                "data": [random.Random(i).random() for _ in range(4)]}]}  # fmt: skip
            return http_call(f"http://{process.http}/v2/models/{models[i % 2]}/infer", json.dumps(body).encode())[0]

        with ThreadPoolExecutor(4) as pool:
            assert set(pool.map(ask, range(60))) == {200}
        yield process
    finally:
        worker.terminate()
        worker.wait(30)
        assert process.stop() == 0, (tmp_path / "server.log").read_text()


@pytest.mark.slow
def test_every_metric_of_tritons_dashboard_is_exposed_with_its_labels_and_data(server: ServerProcess) -> None:
    def exposed() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        status, body = http_call(f"http://{server.http}/metrics")
        assert status == 200
        return samples(body.decode())

    # Answered before /metrics is read: a request is counted once its answer is made, not once it is sent.
    wait_for(lambda: sum(exposed().get("nv_inference_request_success", {}).values()) == 60)
    found = exposed()
    for metric, labels in sorted(dashboard_needs(DASHBOARD).items()):
        if metric.startswith(GPU_PREFIX):  # emulated devices: no GPU, so no GPU figures (none made up)
            assert metric not in found, metric
            continue
        assert found.get(metric), f"{metric} is not exposed"
        for sample_labels in found[metric]:
            missing = labels - SCRAPE_LABELS - {name for name, _ in sample_labels}
            assert not missing, f"{metric}{dict(sample_labels)} lacks {missing}"
        if metric in SERVED:
            assert sum(found[metric].values()) > 0, metric
    assert not any(name.startswith(GPU_PREFIX) for name in found)
