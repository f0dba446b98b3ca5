"""The OpenAPI 3.1 document of the HTTP API, served at ``/v2/openapi.json``."""

from __future__ import annotations

from typing import Any

import mainspring
from mainspring.protocol.tensors import DATATYPES

_ERROR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_MODEL = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}


def _ok(description: str, schema: str | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description}
    if schema:
        response["content"] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}
    return response


def _op(
    summary: str, ok: dict[str, Any], *errors: int, body: str | None = None, path_params: int = 0
) -> dict[str, Any]:
    # 401: with auth_token set (the repository API; everything but health with auth_inference)
    responses = {"200": ok, **{str(e): _ERROR for e in (*errors, 401)}}
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    op["parameters"] = [_MODEL, _VERSION][:path_params]
    if body:
        op["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"},
                                         "description": "binary tensor extension: JSON header of "
                                                        "Inference-Header-Content-Length bytes, then raw tensors"},
        }}  # fmt: skip
    return op


def _optional_body(op: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A repository call's body: optional JSON (anything it cannot honour is a 400)."""
    op["requestBody"] = {"required": False, "content": {"application/json": {"schema": schema}}}
    return op


def _probe(summary: str, failed: str, path_params: int = 0) -> dict[str, Any]:
    """A readiness or liveness probe: the status is the answer, neither has a body (as Triton's)."""
    status = "400" if path_params else "503"
    responses: dict[str, Any] = {"200": {"description": summary}, status: {"description": failed}}
    if path_params:
        responses["401"] = _ERROR
    return {"summary": summary, "responses": responses, "parameters": [_MODEL, _VERSION][:path_params]}


def _paths() -> dict[str, Any]:
    paths: dict[str, Any] = {
        "/v2/health/live": {"get": _probe("server is live", "not live")},
        "/v2/health/ready": {"get": _probe("server is ready (a worker is connected)", "not ready")},
        "/v2": {"get": _op("server metadata", _ok("metadata", "ServerMetadata"))},
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "text format"}, "401": _ERROR},
            }
        },
        "/v2/repository/index": {
            "post": _optional_body(
                _op("models in the repository and their state", _ok("index", "Index"), 400, 408),
                {"type": "object", "properties": {"ready": {"type": "boolean", "description": "only the ready ones"}}},
            )
        },
        "/v2/repository/models/{model}/load": {
            "post": _optional_body(
                _op(
                    "load a model; a served one whose repository entry changed is reloaded in place "
                    "(Triton's config and file overrides are refused)",
                    _ok("loaded"),
                    400,
                    404,
                    408,
                    503,
                    path_params=1,
                ),
                {"type": "object", "properties": {"parameters": {"type": "object", "maxProperties": 0}}},
            )
        },
        "/v2/repository/models/{model}/unload": {
            "post": _optional_body(
                _op("unload a model", _ok("unloaded"), 400, 404, 408, path_params=1),
                {
                    "type": "object",
                    "properties": {
                        "parameters": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {"unload_dependents": {"type": "boolean"}},
                        }
                    },
                },
            )
        },
        "/v2/models/stats": {"get": _op("statistics of every model", _ok("statistics"))},
    }
    for prefix, params in (("/v2/models/{model}", 1), ("/v2/models/{model}/versions/{version}", 2)):
        # 400: a name or version past max_string_bytes
        paths[prefix] = {"get": _op("model metadata", _ok("metadata", "ModelMetadata"), 400, 404, path_params=params)}
        paths[f"{prefix}/ready"] = {"get": _probe("model is ready", "not ready or unknown", params)}
        paths[f"{prefix}/config"] = {"get": _op("model configuration", _ok("config"), 400, 404, path_params=params)}
        paths[f"{prefix}/stats"] = {"get": _op("model statistics", _ok("statistics"), 400, 404, path_params=params)}
        paths[f"{prefix}/infer"] = {"post": _op(
            "inference; SLO from parameters slo_ms or timeout (us), else the model's or the server's default",
            _ok("outputs", "InferResponse"), 400, 404, 408, 413, 429, 500, 503, 504, body="InferRequest",
            path_params=params,
        )}  # fmt: skip
    return paths


def _schemas() -> dict[str, Any]:
    tensor_meta = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
        "name": {"type": "string"}, "datatype": {"type": "string", "enum": list(DATATYPES)},
        "shape": {"type": "array", "items": {"type": "integer"}},
    }}  # fmt: skip
    tensor = {"allOf": [tensor_meta, {"type": "object", "properties": {
        "data": {"type": "array"}, "parameters": {"type": "object", "properties": {
            "binary_data_size": {"type": "integer"}, "binary_data": {"type": "boolean"}}},
    }}]}  # fmt: skip
    answered = {"allOf": [tensor, {"type": "object", "properties": {  # classification answers in BYTES
        "datatype": {"type": "string", "enum": [*DATATYPES, "BYTES"]}}}]}  # fmt: skip
    return {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        "ServerMetadata": {"type": "object", "properties": {
            "name": {"type": "string"}, "version": {"type": "string"},
            "extensions": {"type": "array", "items": {"type": "string"}}}},
        "ModelMetadata": {"type": "object", "properties": {
            "name": {"type": "string"}, "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"}, "inputs": {"type": "array", "items": tensor_meta},
            "outputs": {"type": "array", "items": tensor_meta}}},
        "Index": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "version": {"type": "string"}, "state": {"type": "string"},
            "reason": {"type": "string"}}}},
        "InferRequest": {"type": "object", "required": ["inputs"], "properties": {
            "id": {"type": "string"},
            "parameters": {"type": "object", "properties": {
                "slo_ms": {"type": "number"}, "timeout": {"type": "integer", "description": "microseconds"},
                "priority": {"type": "integer", "minimum": 0, "description": "accepted; every level is served alike"},
                "binary_data_output": {"type": "boolean"}}},
            "inputs": {"type": "array", "items": tensor},
            "outputs": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "parameters": {"type": "object", "properties": {
                    "binary_data": {"type": "boolean"},
                    "classification": {"type": "integer", "minimum": 1, "description": "top classes instead"}}}}}}}},
        "InferResponse": {"type": "object", "properties": {
            "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
            "outputs": {"type": "array", "items": answered}}},
    }  # fmt: skip


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Mainspring inference API (KServe v2 / Open Inference Protocol)",
            "version": mainspring.__version__,
        },
        "paths": _paths(),
        "components": {"schemas": _schemas()},
    }
