"""deploy/k8s: the rendered set validated offline against Kubernetes' own schemas (strict: an unknown
field fails, as `kubectl apply` refuses it), and what it starts checked against the real commands: the
controller's settings from the ConfigMap and Secret, the workers' way in, probes, ports and references."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

import mainspring
from mainspring.cli.commands import build_parser
from mainspring.serving.config import ServeConfig, load_config
from tests.deploy.manifests import (
    Resource,
    container,
    container_environment,
    expand,
    kubectl_render,
    one,
    pod_spec,
    render,
)

# The oldest Kubernetes still supported upstream when this was written, and the newest the validator knows.
KUBERNETES_VERSIONS = ("1.32.0", "1.37.0")
FILLED = {"auth_token": "a-token-for-the-test", "worker_secret": "a-secret-for-the-test"}


@pytest.fixture(scope="module")
def resources() -> list[Resource]:
    return render()


def filled(resources: list[Resource]) -> list[Resource]:
    """The set with its Secret filled in, as docs/deploy.md tells a user to."""
    secret = one(resources, "Secret", "mainspring-secrets")
    return [r if r is not secret else {**secret, "stringData": dict(FILLED)} for r in resources]


def test_kubectl_kustomize_renders_what_the_tests_read(resources: list[Resource]) -> None:
    rendered = kubectl_render()
    if rendered is None:
        pytest.skip("no kubectl here: the tests read kustomization.yaml's resources themselves")
    key = lambda r: (r["kind"], r["metadata"]["name"])  # noqa: E731
    assert sorted(rendered, key=key) == sorted(resources, key=key)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_resource_validates_strictly_against_the_kubernetes_schemas(
    resources: list[Resource], version: str
) -> None:
    assert {r["kind"] for r in resources} >= {"Deployment", "DaemonSet", "Service", "ConfigMap", "Secret"}
    for resource in resources:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = "/".join(map(str, error.path))
            pytest.fail(f"{resource['kind']}/{resource['metadata']['name']} at {where}: {error.message}")


def serve_config(resources: list[Resource], folder: Path) -> ServeConfig:
    """The settings the controller's container starts with: its args through the real parser, the
    ConfigMap's file where the pod mounts it, the environment Kubernetes would give it."""
    controller = one(resources, "Deployment", "mainspring-controller")
    pod, main = pod_spec(controller), container(controller)
    env = container_environment(pod, main.get("env", []), resources)
    args = build_parser().parse_args(expand(main["args"], env))
    assert args.command == "serve"
    (mount,) = [m for m in main["volumeMounts"] if m["name"] == "serve-config"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "serve-config"]
    config_map = one(resources, "ConfigMap", volume["configMap"]["name"])
    (name,) = config_map["data"]
    assert args.config == Path(mount["mountPath"]) / name
    file = folder / name
    file.write_text(config_map["data"][name])
    fields = {f.name for f in dataclasses.fields(ServeConfig)}
    flags = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    return load_config(file, env, flags, args.clockwork)


def test_the_controller_starts_with_the_configmap_and_the_secret_it_is_given(
    resources: list[Resource], tmp_path: Path
) -> None:
    config = serve_config(filled(resources), tmp_path)
    assert (config.auth_token, config.worker_secret) == (FILLED["auth_token"], FILLED["worker_secret"])
    assert config.workers == "tcp" and config.host == "0.0.0.0" and config.repo == "/models"
    ports = {
        p["name"]: p["containerPort"] for p in container(one(resources, "Deployment", "mainspring-controller"))["ports"]
    }
    assert ports == {"http": config.http_port, "grpc": config.grpc_port, "workers": config.worker_port}
    requested = container(one(resources, "Deployment", "mainspring-controller"))["resources"]["requests"]["cpu"]
    assert config.frontend_count == 1 and int(requested) == 2 * config.frontend_count  # not the node's cores


def test_left_as_committed_the_secret_stops_the_controller_from_starting_open(
    resources: list[Resource], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="workers='tcp' needs worker_secret"):
        serve_config(resources, tmp_path)


def test_service_links_would_stop_the_controller_so_its_pod_turns_them_off(
    resources: list[Resource], tmp_path: Path
) -> None:
    """Kubernetes names a Service's variables after it: the Service mainspring gives
    MAINSPRING_SERVICE_HOST, mainspring-workers MAINSPRING_WORKERS_PORT; serve reads each as a setting."""
    linked = [r if r["kind"] != "Deployment" else _with_service_links(r) for r in filled(resources)]
    with pytest.raises(ValueError, match="environment variable MAINSPRING_"):
        serve_config(linked, tmp_path)
    for kind in ("Deployment", "DaemonSet"):
        assert all(pod_spec(r)["enableServiceLinks"] is False for r in resources if r["kind"] == kind)


def _with_service_links(deployment: Resource) -> Resource:
    template = deployment["spec"]["template"]
    spec = {k: v for k, v in template["spec"].items() if k != "enableServiceLinks"}
    return {**deployment, "spec": {**deployment["spec"], "template": {**template, "spec": spec}}}


def _secret_refs(env: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {v["name"]: (v["valueFrom"]["secretKeyRef"]["name"], v["valueFrom"]["secretKeyRef"]["key"])
            for v in env if "secretKeyRef" in v.get("valueFrom", {})}  # fmt: skip


def test_secrets_reach_the_processes_through_the_environment_only(resources: list[Resource]) -> None:
    controller = container(one(resources, "Deployment", "mainspring-controller"))
    worker = container(one(resources, "DaemonSet", "mainspring-worker"))
    worker_secret = {"MAINSPRING_WORKER_SECRET": ("mainspring-secrets", "worker_secret")}
    assert _secret_refs(controller["env"]) == {
        "MAINSPRING_AUTH_TOKEN": ("mainspring-secrets", "auth_token"),
        **worker_secret,
    }
    assert _secret_refs(worker["env"]) == worker_secret
    for main in (controller, worker):
        assert not any("secret" in a.lower() or "token" in a.lower() for a in main["args"]), main["args"]
    settings = tomllib.loads(one(resources, "ConfigMap", "mainspring-serve")["data"]["serve.toml"])
    assert not {"auth_token", "worker_secret"} & set(settings.get("serve", settings))


def worker_args(resources: list[Resource]) -> argparse.Namespace:
    daemon_set = one(resources, "DaemonSet", "mainspring-worker")
    main = container(daemon_set)
    env = container_environment(pod_spec(daemon_set), main["env"], filled(resources))
    args = build_parser().parse_args(expand(main["args"], env))
    assert args.command == "worker"
    return args


def test_workers_join_through_a_service_that_does_not_wait_for_the_controller_to_be_ready(
    resources: list[Resource], tmp_path: Path
) -> None:
    """The controller is ready once a worker has joined: the workers' Service must publish it before."""
    args = worker_args(resources)
    host, port = args.controller.removeprefix("tcp://").rsplit(":", 1)
    service = one(resources, "Service", host)
    assert service["spec"]["publishNotReadyAddresses"] is True
    (service_port,) = [p for p in service["spec"]["ports"] if p["port"] == int(port)]
    controller = one(resources, "Deployment", "mainspring-controller")
    assert service["spec"]["selector"].items() <= controller["spec"]["template"]["metadata"]["labels"].items()
    named = {p["name"]: p["containerPort"] for p in container(controller)["ports"]}
    assert named[service_port["targetPort"]] == serve_config(filled(resources), tmp_path).worker_port
    assert args.device == "cuda:0" and args.name == "made-up-spec.nodeName" and args.emulate is None
    limits = container(one(resources, "DaemonSet", "mainspring-worker"))["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1


def test_the_controller_is_probed_on_the_health_endpoints_and_clients_reach_only_a_ready_one(
    resources: list[Resource],
) -> None:
    controller = container(one(resources, "Deployment", "mainspring-controller"))
    probes = {kind: controller[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    live, ready = "/v2/health/live", "/v2/health/ready"
    paths = {kind: probe["path"] for kind, probe in probes.items()}
    assert paths == {"startupProbe": live, "livenessProbe": live, "readinessProbe": ready}
    assert {probe["port"] for probe in probes.values()} == {"http"}
    clients = one(resources, "Service", "mainspring")
    assert not clients["spec"].get("publishNotReadyAddresses", False)
    assert {p["targetPort"] for p in clients["spec"]["ports"]} == {"http", "grpc"}


def test_every_reference_resolves_within_the_set(resources: list[Resource]) -> None:
    names = {(r["kind"], r["metadata"]["name"]) for r in resources}
    pods = [r for r in resources if r["kind"] in ("Deployment", "DaemonSet")]
    for workload in pods:
        pod = pod_spec(workload)
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert (
            workload["spec"]["selector"]["matchLabels"].items()
            <= workload["spec"]["template"]["metadata"]["labels"].items()
        )
        for mount in container(workload)["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in names
        for secret, _ in _secret_refs(container(workload)["env"]).values():
            assert ("Secret", secret) in names
    for service in (r for r in resources if r["kind"] == "Service"):
        targets = [
            p
            for p in pods
            if service["spec"]["selector"].items() <= p["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, service["metadata"]["name"]
        named = {p["name"] for p in container(targets[0])["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= named


def test_images_are_the_ones_make_image_builds_and_metrics_are_announced_on_the_http_port(
    resources: list[Resource],
) -> None:
    controller = one(resources, "Deployment", "mainspring-controller")
    assert container(controller)["image"] == f"mainspring:{mainspring.__version__}"
    assert (
        container(one(resources, "DaemonSet", "mainspring-worker"))["image"]
        == f"mainspring:{mainspring.__version__}-cuda"
    )
    annotations = controller["spec"]["template"]["metadata"]["annotations"]
    http = {p["name"]: p["containerPort"] for p in container(controller)["ports"]}["http"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(http),
        "prometheus.io/path": "/metrics",
    }
