"""KServe v2 over HTTP (aiohttp): translation only; the data plane decides.

JSON tensors and the binary tensor extension (``Inference-Header-Content-Length``: the
JSON header, then the raw tensors in order). Errors are ``{"error": "..."}`` with the
data plane's status; nothing a client sends can take the server down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from mainspring.frontend.access import UNAUTHORIZED, http_scope
from mainspring.frontend.connections import ConnectionWatch, WatchedSite, ensure_descriptors
from mainspring.frontend.dashboard import asset as dashboard_asset
from mainspring.frontend.dashboard import page as dashboard_page
from mainspring.frontend.dashboard import timeline_cursor, timeline_seconds
from mainspring.frontend.dataplane import DataPlane, InferenceError, Tensor, decode_tensor
from mainspring.frontend.extensions import class_count, json_bytes, serialize_bytes
from mainspring.frontend.limits import RequestLimits
from mainspring.frontend.openapi import openapi_document
from mainspring.frontend.shared_memory import CUDA_UNSUPPORTED, Placement, SharedMemoryRegions, placement

log = logging.getLogger(__name__)

HEADER_LENGTH = "Inference-Header-Content-Length"
PLANE = web.AppKey("plane", DataPlane)
CONNECTIONS = web.AppKey("connections", ConnectionWatch)
ARRIVAL = web.RequestKey("arrival_ns", int)  # when the request's headers were read (``time.monotonic_ns``)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _watch(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection's watch that a request is under way (its headers are in) and when it ends."""
    request[ARRIVAL] = time.monotonic_ns()  # its headers are in: from here the call's time counts
    connection = request.app[CONNECTIONS].connection(request.transport)
    if connection is not None:
        connection.request_started()
    try:
        return await handler(request)
    finally:
        if connection is not None:
            connection.request_finished(body_read=request.content.is_eof())


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except InferenceError as error:
        body = (
            {"error": error.message}
            if error.outcome is None
            else {"error": error.message, "outcome": error.outcome.value}
        )
        response = web.json_response(body, status=error.status)
        if error.status == 408:  # the rest of a body that came too slowly is not waited for (``_body``)
            response.force_close()
        return response
    except ConnectionError:  # the client hung up mid-request: not the server's error, and nobody reads the answer
        _plane(request).dropped.record("http", "hung_up")
        response = web.Response(status=499, reason="Client Closed Request")  # nginx's status for it, in its logs
        response.force_close()
        return response
    except web.HTTPRequestEntityTooLarge:
        limit = _plane(request).limits.max_body_bytes
        message = f"request body exceeds the limit of {limit} bytes (max_body_bytes)"
        return web.json_response({"error": message}, status=413)
    except web.HTTPException as error:  # unknown path, wrong method
        if error.status < 400:
            raise
        return web.json_response({"error": error.reason}, status=error.status)
    except Exception as error:  # a bug must answer 500, not drop the connection
        log.exception("internal error on %s %s", request.method, request.path)
        return web.json_response({"error": f"internal error: {type(error).__name__}: {error}"}, status=500)


@web.middleware
async def _authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
    if _plane(request).access.allows(http_scope(request.path), request.headers.get("Authorization")):
        return await handler(request)
    return web.json_response({"error": UNAUTHORIZED}, status=401, headers={"WWW-Authenticate": "Bearer"})


def _plane(request: web.Request) -> DataPlane:
    return request.app[PLANE]


def _version(request: web.Request) -> str | None:
    return request.match_info.get("version")


async def live(request: web.Request) -> web.Response:
    return web.Response(status=200 if _plane(request).live() else 503)


async def ready(request: web.Request) -> web.Response:
    return web.Response(status=200 if _plane(request).ready() else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response(_plane(request).server_metadata())


async def model_metadata(request: web.Request) -> web.Response:
    return web.json_response(_plane(request).model_metadata(request.match_info["model"], _version(request)))


async def model_ready(request: web.Request) -> web.Response:
    ok = _plane(request).model_ready(request.match_info["model"], _version(request))
    return web.Response(status=200 if ok else 400)


async def model_config(request: web.Request) -> web.Response:
    return web.json_response(_plane(request).model_config(request.match_info["model"], _version(request)))


async def model_stats(request: web.Request) -> web.Response:
    return web.json_response(await _plane(request).model_stats(request.match_info.get("model"), _version(request)))


async def repository_index(request: web.Request) -> web.Response:
    document = await _optional_object(request)
    return web.json_response(_plane(request).repository_index(_flag(document, "ready", "request")))


async def repository_load(request: web.Request) -> web.Response:
    parameters = _dict((await _optional_object(request)).get("parameters", {}), "parameters")
    await _plane(request).load(request.match_info["model"], parameters)
    return web.json_response({})


async def repository_unload(request: web.Request) -> web.Response:
    parameters = _dict((await _optional_object(request)).get("parameters", {}), "parameters")
    await _plane(request).unload(request.match_info["model"], parameters)
    return web.json_response({})


async def shm_status(request: web.Request) -> web.Response:
    regions = _plane(request).shared_memory.status(request.match_info.get("region", ""))
    return web.json_response([vars(region) for region in regions])


async def shm_register(request: web.Request) -> web.Response:
    document = await _optional_object(request)
    name = request.match_info["region"]
    _plane(request).shared_memory.register(name, document.get("key"), document.get("offset", 0),
                                           document.get("byte_size"))  # fmt: skip
    return web.json_response({})


async def shm_unregister(request: web.Request) -> web.Response:
    _plane(request).shared_memory.unregister(request.match_info.get("region", ""))
    return web.json_response({})


async def cuda_shm_status(request: web.Request) -> web.Response:
    if region := request.match_info.get("region"):  # none is ever registered
        raise InferenceError(400, f"Unable to find cuda shared memory region: {region!r}")
    return web.json_response([])


async def cuda_shm_register(request: web.Request) -> web.Response:
    raise InferenceError(501, CUDA_UNSUPPORTED)


async def cuda_shm_unregister(request: web.Request) -> web.Response:
    return web.json_response({})  # nothing to forget: none is ever registered


async def _optional_object(request: web.Request) -> dict[str, Any]:
    """The body of a repository call: none, or a JSON object."""
    body = await _body(request)
    return _json_object(body, _plane(request).limits) if body.strip() else {}


async def _body(request: web.Request) -> bytes:
    """The whole body, within ``body_timeout_s`` (408 past it: a client may not hold a request open)."""
    plane = _plane(request)
    timeout = plane.limits.body_timeout_s
    try:
        async with asyncio.timeout(timeout):
            return await request.read()
    except TimeoutError:
        plane.dropped.record("http", "body_timeout")
        if (connection := request.app[CONNECTIONS].connection(request.transport)) is not None:
            connection.close_after_answer()
        raise InferenceError(408, f"request body not received within {timeout:g} s (body_timeout_s)") from None


async def metrics(request: web.Request) -> web.Response:
    body = await _plane(request).service.exposition()
    return web.Response(body=body, content_type="text/plain", charset="utf-8", headers={"X-Version": "0.0.4"})


async def dashboard_timeline(request: web.Request) -> web.Response:
    seconds = timeline_seconds(request.query.get("seconds", "10"))
    cursor = timeline_cursor(request.query.get("cursor", ""))
    view = await _plane(request).service.timeline_view(seconds, cursor)
    return web.Response(body=msgspec.json.encode(view), content_type="application/json")


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


async def infer(request: web.Request) -> web.Response:
    body = await _body(request)  # read even when shed: a connection whose body is left unread cannot be kept
    _plane(request).admit_call("http")
    header, binary = _split_body(request, body)
    limits = _plane(request).limits
    document = _json_object(header, limits)
    parameters = _dict(document.get("parameters", {}), "parameters")
    if not isinstance(document.get("id", ""), str):
        raise InferenceError(400, f"id must be a string, got {document['id']!r}"[:200])
    regions = _plane(request).shared_memory
    inputs = _inputs(document.get("inputs"), binary, limits, regions)
    requested = _requested_outputs(document.get("outputs"), limits, regions)
    binary_all = _flag(parameters, "binary_data_output", "parameters")
    model = request.match_info["model"]
    classes = {name: wanted.classes for name, wanted in requested.items()}
    plane = _plane(request)
    traced = request.headers if plane.tracing is not None else None  # where a traceparent is, when tracing is on
    served, outputs = await plane.infer(
        model, _version(request), inputs, classes or None, parameters, request[ARRIVAL], traced
    )
    reply: dict[str, Any] = {"model_name": model, "model_version": str(served.version), "outputs": []}
    if "id" in document:
        reply["id"] = document["id"]
    chunks: list[bytes] = []
    for tensor in outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        text_bytes = tensor.datatype == "BYTES"
        wanted = requested.get(tensor.name, _Wanted(binary_all))
        if wanted.binary or wanted.placement is not None:
            raw = serialize_bytes(tensor.data) if text_bytes else tensor.data.tobytes()
            if wanted.placement is not None:  # written where the client reads it: no data in the reply
                regions.write(wanted.placement, raw, f"output {tensor.name!r}")
                entry["parameters"] = {"shared_memory_region": wanted.placement.region,
                                       "shared_memory_byte_size": len(raw)}  # fmt: skip
            else:
                entry["parameters"] = {"binary_data_size": len(raw)}
                chunks.append(raw)
        else:
            entry["data"] = json_bytes(tensor.data) if text_bytes else tensor.data.ravel().tolist()
        reply["outputs"].append(entry)
    text = msgspec.json.encode(reply)
    if not chunks:
        return web.Response(body=text, content_type="application/json")
    headers = {HEADER_LENGTH: str(len(text))}
    return web.Response(body=b"".join([text, *chunks]), content_type="application/octet-stream", headers=headers)


def _json_object(text: bytes, limits: RequestLimits) -> dict[str, Any]:
    try:
        document = msgspec.json.decode(text)  # ~5x faster than json.loads on large tensors
    except msgspec.DecodeError as error:
        raise InferenceError(400, f"request body is not valid JSON: {error}") from None
    except RecursionError:  # msgspec's answer to nesting deeper than the interpreter's limit
        raise InferenceError(400, "request body is nested too deeply to be a KServe v2 request") from None
    if not isinstance(document, dict):
        raise InferenceError(400, "request body must be a JSON object")
    limits.check_document(document)
    return document


def _split_body(request: web.Request, body: bytes) -> tuple[bytes, bytes]:
    length = request.headers.get(HEADER_LENGTH)
    if length is None:
        return body, b""
    try:
        size = int(length)
    except ValueError:
        raise InferenceError(400, f"{HEADER_LENGTH} must be an integer, got {length!r}") from None
    if size < 0:
        raise InferenceError(400, f"{HEADER_LENGTH} must not be negative, got {size}")
    if size > len(body):
        raise InferenceError(400, f"{HEADER_LENGTH} {size} exceeds the body of {len(body)} bytes")
    return body[:size], body[size:]


def _dict(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InferenceError(400, f"{field} must be a JSON object")
    return value


def _flag(parameters: dict[str, Any], key: str, where: str) -> bool:
    """A true/false parameter; a string such as "false" is refused, not read as true."""
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise InferenceError(400, f"{where}: {key} must be true or false, got {value!r}")
    return value


def _inputs(value: Any, binary: bytes, limits: RequestLimits, regions: SharedMemoryRegions) -> list[Tensor]:
    if not isinstance(value, list) or not value:
        raise InferenceError(400, "inputs must be a non-empty list")
    limits.check_count("inputs", len(value))
    tensors, offset, values = [], 0, 0
    for index, entry in enumerate(value):
        entry = _dict(entry, f"inputs[{index}]")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise InferenceError(400, f"inputs[{index}].name must be a non-empty string")
        datatype = entry.get("datatype")
        if not isinstance(datatype, str):
            raise InferenceError(400, f"input {name!r}: datatype must be a string")
        parameters = _dict(entry.get("parameters", {}), f"input {name!r} parameters")
        size = parameters.get("binary_data_size")
        raw = None
        if (where := placement(parameters, f"input {name!r}")) is not None:
            if "data" in entry or size is not None:  # two sources of one tensor's data
                raise InferenceError(400, f"input {name!r}: data must be left out with shared_memory_region")
            raw = regions.read(where, f"input {name!r}")
        elif size is not None:
            if "data" in entry:  # two sources of one tensor's data: which one is meant is unknown (as over gRPC)
                raise InferenceError(400, f"input {name!r}: data must be left out with binary_data_size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise InferenceError(400, f"input {name!r}: binary_data_size {size!r} does not fit the binary data")
            raw, offset = binary[offset : offset + size], offset + size
        elif "data" not in entry:
            raise InferenceError(400, f"input {name!r}: neither data nor binary_data_size is given")
        tensor, values = decode_tensor(name, datatype, entry.get("shape"), entry.get("data"), raw, limits, values)
        tensors.append(tensor)
    if offset != len(binary):
        raise InferenceError(400, f"{len(binary) - offset} bytes of binary data belong to no input")
    return tensors


@dataclass(frozen=True)
class _Wanted:
    """How a requested output is to be returned: as binary data, as its top classes (``classes`` > 0:
    the classification extension), in a shared-memory region (``placement``)."""

    binary: bool
    classes: int = 0
    placement: Placement | None = None


def _requested_outputs(value: Any, limits: RequestLimits, regions: SharedMemoryRegions) -> dict[str, _Wanted]:
    """Requested output names, each with how it is wanted; a shared-memory placement it could not be
    written to is refused now, before the model runs."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise InferenceError(400, "outputs must be a list")
    limits.check_count("outputs", len(value))
    requested = {}
    for index, entry in enumerate(value):
        entry = _dict(entry, f"outputs[{index}]")
        name = entry.get("name")
        if not isinstance(name, str):
            raise InferenceError(400, f"outputs[{index}].name must be a string")
        parameters = _dict(entry.get("parameters", {}), f"output {name!r} parameters")
        binary = _flag(parameters, "binary_data", f"output {name!r} parameters")
        if (where := placement(parameters, f"output {name!r}")) is not None:
            regions.check(where, f"output {name!r}")
        requested[name] = _Wanted(binary, class_count(parameters, name), where)
    return requested


def make_app(plane: DataPlane) -> web.Application:
    limits = plane.limits
    header = {"max_line_size": limits.max_header_bytes, "max_field_size": limits.max_header_bytes}
    app = web.Application(middlewares=[_watch, _errors, _authorize], client_max_size=limits.max_body_bytes,
                          handler_args=header)  # fmt: skip
    app[PLANE] = plane
    app[CONNECTIONS] = ConnectionWatch(limits, plane.dropped)
    get, post = web.get, web.post
    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    app.add_routes([
        get("/v2/health/live", live),
        get("/v2/health/ready", ready),
        get("/v2", server_metadata),
        get("/v2/openapi.json", openapi),
        get("/metrics", metrics),
        get("/dashboard", dashboard_page),
        get("/dashboard/timeline", dashboard_timeline),
        get("/dashboard/{asset}", dashboard_asset),
        get("/v2/models/stats", model_stats),
        get(model, model_metadata),
        get(versioned, model_metadata),
        get(f"{model}/ready", model_ready),
        get(f"{versioned}/ready", model_ready),
        get(f"{model}/config", model_config),
        get(f"{versioned}/config", model_config),
        get(f"{model}/stats", model_stats),
        get(f"{versioned}/stats", model_stats),
        post(f"{model}/infer", infer),
        post(f"{versioned}/infer", infer),
        post("/v2/repository/index", repository_index),
        post("/v2/repository/models/{model}/load", repository_load),
        post("/v2/repository/models/{model}/unload", repository_unload),
        get("/v2/systemsharedmemory/status", shm_status),
        get("/v2/systemsharedmemory/region/{region}/status", shm_status),
        post("/v2/systemsharedmemory/region/{region}/register", shm_register),
        post("/v2/systemsharedmemory/unregister", shm_unregister),
        post("/v2/systemsharedmemory/region/{region}/unregister", shm_unregister),
        get("/v2/cudasharedmemory/status", cuda_shm_status),
        get("/v2/cudasharedmemory/region/{region}/status", cuda_shm_status),
        post("/v2/cudasharedmemory/region/{region}/register", cuda_shm_register),
        post("/v2/cudasharedmemory/unregister", cuda_shm_unregister),
        post("/v2/cudasharedmemory/region/{region}/unregister", cuda_shm_unregister),
    ])  # fmt: skip
    return app


async def start_http(plane: DataPlane, host: str, port: int, reuse_port: bool | None = None) -> web.AppRunner:
    """Serve ``plane`` over HTTP on ``host:port`` with its connection limits; returns the started runner."""
    app = make_app(plane)
    plane.gate.watch()
    ensure_descriptors(plane.limits.max_connections)
    # shutdown_timeout: requests were answered by the drain; idle connections must not hold a stop for 60 s.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0, keepalive_timeout=plane.limits.idle_timeout_s)
    await runner.setup()
    await WatchedSite(runner, app[CONNECTIONS], host, port, reuse_port=reuse_port).start()
    return runner
