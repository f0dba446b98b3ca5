"""The deployment manifests as a cluster would receive them: deploy/k8s rendered by its kustomization.yaml
(read here; `kubectl kustomize` renders the same, tests/deploy/test_kubernetes.py checks), deploy/kserve
as written; and what a pod's container would start with."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from tests.deploy.dockerfiles import ROOT

K8S = ROOT / "deploy" / "k8s"
KSERVE = ROOT / "deploy" / "kserve"
CLUSTER_SCOPED = {"Namespace", "ClusterServingRuntime", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}
# What this reading of kustomization.yaml carries out; anything else there must fail the tests, not be skipped.
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "namespace", "labels", "resources"}

Resource = dict[str, Any]


def documents(path: Path) -> list[Resource]:
    return [doc for doc in yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader) if doc is not None]


def render(folder: Path = K8S) -> list[Resource]:
    """The resources kustomization.yaml lists, with its namespace and labels applied (``labels`` as
    kustomize applies them without ``includeSelectors``: to each resource's own metadata only)."""
    (kustomization,) = documents(folder / "kustomization.yaml")
    unknown = set(kustomization) - KUSTOMIZATION_KEYS
    assert not unknown, f"kustomization.yaml uses {sorted(unknown)}: teach tests/deploy/manifests.py's render"
    rendered = []
    for name in kustomization["resources"]:
        for resource in documents(folder / name):
            resource = copy.deepcopy(resource)
            metadata = resource.setdefault("metadata", {})
            if "namespace" in kustomization and resource["kind"] not in CLUSTER_SCOPED:
                metadata["namespace"] = kustomization["namespace"]
            for entry in kustomization.get("labels", []):
                assert set(entry) == {"pairs"}, f"labels entry {entry}: only pairs are read here"
                metadata.setdefault("labels", {}).update(entry["pairs"])
            rendered.append(resource)
    return rendered


def kubectl_render(folder: Path = K8S) -> list[Resource] | None:
    """``kubectl kustomize`` (kustomize built into kubectl) of ``folder``; None without kubectl."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    output = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=True, timeout=120
    )
    return [doc for doc in yaml.load_all(output.stdout, Loader=yaml.CSafeLoader) if doc is not None]


def one(resources: list[Resource], kind: str, name: str | None = None) -> Resource:
    found = [r for r in resources if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def pod_spec(resource: Resource) -> dict[str, Any]:
    spec: dict[str, Any] = resource["spec"]["template"]["spec"]
    return spec


def container(resource: Resource) -> dict[str, Any]:
    (only,) = pod_spec(resource)["containers"]
    return dict(only)


def service_link_variables(services: list[Resource]) -> dict[str, str]:
    """What Kubernetes puts in a pod's environment for each Service of its namespace while the pod's
    enableServiceLinks is true (its default): NAME_SERVICE_HOST, NAME_PORT, NAME_PORT_8000_TCP, ..."""
    variables = {}
    for index, service in enumerate(services):
        prefix = re.sub(r"[^A-Z0-9]", "_", service["metadata"]["name"].upper())
        host = f"10.96.0.{index + 10}"
        ports = service["spec"]["ports"]
        variables[f"{prefix}_SERVICE_HOST"] = host
        variables[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        variables[f"{prefix}_PORT"] = f"tcp://{host}:{ports[0]['port']}"
        for port in ports:
            number = port["port"]
            base = f"{prefix}_PORT_{number}_TCP"
            variables.update({base: f"tcp://{host}:{number}", f"{base}_PROTO": "tcp",
                              f"{base}_PORT": str(number), f"{base}_ADDR": host})  # fmt: skip
            if "name" in port:
                variables[f"{prefix}_SERVICE_PORT_{port['name'].upper()}"] = str(number)
    return variables


def container_environment(pod: dict[str, Any], env: list[dict[str, Any]], resources: list[Resource]) -> dict[str, str]:
    """A container's variables as Kubernetes sets them: service links (unless the pod turns them off),
    then its env, secretKeyRef and configMapKeyRef read from ``resources`` (fieldRef: a made-up value)."""
    namespace_services = [r for r in resources if r["kind"] == "Service"]
    values = service_link_variables(namespace_services) if pod.get("enableServiceLinks", True) else {}
    for variable in env:
        if "value" in variable:
            values[variable["name"]] = variable["value"]
            continue
        source = variable["valueFrom"]
        if "secretKeyRef" in source:
            reference = source["secretKeyRef"]
            secret = [r for r in resources if r["kind"] == "Secret" and r["metadata"]["name"] == reference["name"]]
            if not secret and reference.get("optional"):
                continue
            (found,) = secret
            values[variable["name"]] = found.get("stringData", {})[reference["key"]]
        elif "fieldRef" in source:
            values[variable["name"]] = f"made-up-{source['fieldRef']['fieldPath']}"
        else:
            raise AssertionError(f"unread valueFrom {source}")
    return values


def expand(arguments: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(NAME) references in args, expanded from the container's variables."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in arguments]
