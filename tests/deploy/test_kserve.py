"""deploy/kserve: the ClusterServingRuntime and the example InferenceService validated against KServe's
own CRD schemas (vendored in kserve_crds/, source and commit in each file's header), made strict as the
API server is with `kubectl apply` (an unknown field is an error); and the runtime's container checked
against the real serve command and the image it names."""

from __future__ import annotations

import copy
import dataclasses
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]

import mainspring
from mainspring.cli.commands import build_parser
from mainspring.serving.config import ServeConfig, load_config
from tests.deploy.dockerfiles import DOCKERFILES, environment, final_stage
from tests.deploy.manifests import KSERVE, Resource, container_environment, documents, one

CRDS = Path(__file__).parent / "kserve_crds"
RUNTIME = KSERVE / "cluster-serving-runtime.yaml"
EXAMPLE = KSERVE / "inference-service.yaml"
KSERVE_PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}  # KServe's constants.InferenceServiceProtocol


def strict(schema: Any) -> Any:
    """``schema`` with unknown fields refused wherever Kubernetes would refuse them: objects that list
    their properties and do not keep unknown ones."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


@cache
def validator(kind: str, version: str) -> jsonschema.Draft7Validator:
    for file in CRDS.glob("*.yaml"):
        (crd,) = documents(file)
        if crd["spec"]["names"]["kind"] == kind:
            (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
            return jsonschema.Draft7Validator(strict(served["schema"]["openAPIV3Schema"]))
    raise AssertionError(f"no vendored CRD for {kind}")


def problems(resource: Resource) -> list[str]:
    group, _, version = resource["apiVersion"].partition("/")
    assert group == "serving.kserve.io", resource["apiVersion"]
    errors = validator(resource["kind"], version).iter_errors(resource)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


@pytest.fixture(scope="module")
def runtime() -> Resource:
    (only,) = documents(RUNTIME)
    return only


@pytest.fixture(scope="module")
def example() -> Resource:
    (only,) = documents(EXAMPLE)
    return only


def test_the_vendored_crds_name_their_source() -> None:
    for file in CRDS.glob("*.yaml"):
        header = file.read_text()[:400]
        assert "https://github.com/kserve/kserve" in header and f"config/crd/full/{file.name} at commit " in header


def test_the_runtime_and_the_example_validate_against_kserves_schemas(runtime: Resource, example: Resource) -> None:
    assert problems(runtime) == []
    assert problems(example) == []


def test_the_schemas_refuse_what_a_cluster_refuses(runtime: Resource) -> None:
    """The check is not vacuous: a misspelt field and a wrong type fail it."""
    misspelt = copy.deepcopy(runtime)
    misspelt["spec"]["protocolVersion"] = misspelt["spec"].pop("protocolVersions")
    assert any("protocolVersion" in problem for problem in problems(misspelt))
    wrong = copy.deepcopy(runtime)
    wrong["spec"]["supportedModelFormats"][0]["autoSelect"] = "yes"
    assert any("autoSelect" in problem for problem in problems(wrong))


def test_the_runtime_serves_pytorch_and_onnx_over_v2_and_grpc_v2_with_prometheus_annotations(runtime: Resource) -> None:
    spec = runtime["spec"]
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert set(formats) == {"pytorch", "onnx"} and all(f["autoSelect"] is True for f in formats.values())
    assert spec["protocolVersions"] == ["v2", "grpc-v2"] and set(spec["protocolVersions"]) <= KSERVE_PROTOCOLS
    (main,) = spec["containers"]
    assert main["name"] == "kserve-container"  # the name KServe looks for
    assert spec["annotations"] == {"prometheus.kserve.io/port": "8080", "prometheus.kserve.io/path": "/metrics"}


def runtime_config(runtime: Resource) -> ServeConfig:
    """What serve starts with in the runtime's container: the image's ENV, then the container's."""
    (main,) = runtime["spec"]["containers"]
    image = {
        "mainspring:" + mainspring.__version__: DOCKERFILES[0],
        f"mainspring:{mainspring.__version__}-cuda": DOCKERFILES[1],
    }
    env = {
        **environment(final_stage(image[main["image"]])),
        **container_environment({"enableServiceLinks": False}, main["env"], []),
    }
    args = build_parser().parse_args(main["args"])
    assert args.command == "serve" and args.config is None
    fields = {f.name for f in dataclasses.fields(ServeConfig)}
    return load_config(None, env, {k: v for k, v in vars(args).items() if k in fields and v is not None})


def main_cpu(runtime: Resource) -> str:
    (main,) = runtime["spec"]["containers"]
    return str(main["resources"]["requests"]["cpu"])


def test_the_runtime_serves_the_models_at_mnt_models_on_the_ports_it_declares(runtime: Resource) -> None:
    config = runtime_config(runtime)
    assert config.repo == "/mnt/models" and config.host == "0.0.0.0" and config.workers == "local"
    assert config.frontend_count == 1 and int(main_cpu(runtime)) == 2 * config.frontend_count
    (main,) = runtime["spec"]["containers"]
    assert [p["containerPort"] for p in main["ports"]] == [config.http_port] == [8080]  # KServe's default port
    assert config.grpc_port == 9000  # the port KServe's runtimes give gRPC
    assert main["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": config.http_port}
    assert main["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": config.http_port}
    assert int(runtime["spec"]["annotations"]["prometheus.kserve.io/port"]) == config.http_port
    assert main["securityContext"]["runAsNonRoot"] is True and main["securityContext"]["runAsUser"] == 10001


def test_the_example_picks_this_runtime_for_a_format_and_protocol_it_serves(
    runtime: Resource, example: Resource
) -> None:
    predictor = example["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert predictor["enableServiceLinks"] is False  # serve reads every MAINSPRING_* variable
    assert one([runtime], "ClusterServingRuntime")["metadata"]["name"] == "mainspring"


def test_the_runtime_s_secret_is_optional_and_passed_through_the_environment(runtime: Resource) -> None:
    (main,) = runtime["spec"]["containers"]
    (token,) = [variable for variable in main["env"] if "valueFrom" in variable]
    assert token["name"] == "MAINSPRING_AUTH_TOKEN" and token["valueFrom"]["secretKeyRef"]["optional"] is True
    assert not any("token" in a or "secret" in a for a in main["args"])
    assert yaml.safe_dump(runtime).count("worker_secret") == 0  # local workers need none: a private socket
