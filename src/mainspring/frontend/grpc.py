"""KServe v2 over gRPC: ``inference.GRPCInferenceService``, translation only.

The service definition is the protocol's published one as Triton ships it (a superset
of KServe's ``grpc_predict_v2.proto`` with the repository and statistics extensions);
we use the generated stubs inside ``tritonclient`` rather than generating our own, so
the server and the clients people already run share one definition. Errors map the
data plane's status to gRPC codes once, here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from mainspring.frontend.access import UNAUTHORIZED, Access, grpc_scope
from mainspring.frontend.dataplane import DataPlane, InferenceError, Tensor, decode_tensor
from mainspring.frontend.extensions import class_count, serialize_bytes
from mainspring.frontend.limits import RequestLimits
from mainspring.frontend.shared_memory import CUDA_UNSUPPORTED, Placement, SharedMemoryRegions, placement

log = logging.getLogger(__name__)

_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
_CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
}  # fmt: skip

_R = TypeVar("_R")


async def _guard(context: grpc.aio.ServicerContext[Any, Any], work: Callable[[], Awaitable[_R]]) -> _R:
    try:
        return await work()
    except InferenceError as error:
        outcome = () if error.outcome is None else (("mainspring-outcome", error.outcome.value),)
        await context.abort(_CODES.get(error.status, grpc.StatusCode.UNKNOWN), error.message, outcome)
    except Exception as error:
        log.exception("internal error in a gRPC call")
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}")
    raise AssertionError("abort returned")  # pragma: no cover


def _parameter(value: Any) -> Any:
    kind = value.WhichOneof("parameter_choice")
    return getattr(value, kind) if kind else None


def _parameters(parameters: Any) -> dict[str, Any]:
    return {key: _parameter(value) for key, value in parameters.items()}


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - the protocol's names
        return pb.ServerLiveResponse(live=self.plane.live())

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerReadyResponse(ready=self.plane.ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ModelReadyResponse(ready=self.plane.model_ready(request.name, request.version or None))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        meta = self.plane.server_metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def work() -> Any:
            meta = self.plane.model_metadata(request.name, request.version or None)
            tensors = [
                [pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta[key]] for key in ("inputs", "outputs")
            ]
            return pb.ModelMetadataResponse(
                name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                inputs=tensors[0], outputs=tensors[1],
            )  # fmt: skip

        return await _guard(context, work)

    async def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def work() -> Any:
            config = self.plane.model_config(request.name, request.version or None)

            def tensor(t: dict[str, Any]) -> dict[str, Any]:  # the data plane's Triton fields, as the enum
                return {**t, "data_type": mc.DataType.Value(t["data_type"])}

            return pb.ModelConfigResponse(config=mc.ModelConfig(
                name=config["name"], platform=config["platform"], max_batch_size=config["max_batch_size"],
                input=[mc.ModelInput(**tensor(t)) for t in config["input"]],
                output=[mc.ModelOutput(**tensor(t)) for t in config["output"]],
                dynamic_batching=mc.ModelDynamicBatching(**config["dynamic_batching"]),
            ))  # fmt: skip

        return await _guard(context, work)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def work() -> Any:
            stats = (await self.plane.model_stats(request.name or None, request.version or None))["model_stats"]
            return pb.ModelStatisticsResponse(model_stats=[
                pb.ModelStatistics(
                    name=s["name"], version=s["version"], last_inference=s["last_inference"],
                    inference_count=s["inference_count"], execution_count=s["execution_count"],
                    inference_stats=pb.InferStatistics(
                        success=pb.StatisticDuration(**s["inference_stats"]["success"]),
                        fail=pb.StatisticDuration(**s["inference_stats"]["fail"]),
                    ),
                )
                for s in stats
            ])  # fmt: skip

        return await _guard(context, work)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:  # noqa: N802
        entries = self.plane.repository_index(request.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries])

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def work() -> Any:
            await self.plane.load(request.model_name, _parameters(request.parameters))
            return pb.RepositoryModelLoadResponse()

        return await _guard(context, work)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def work() -> Any:
            await self.plane.unload(request.model_name, _parameters(request.parameters))
            return pb.RepositoryModelUnloadResponse()

        return await _guard(context, work)

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def work() -> Any:
            reply = pb.SystemSharedMemoryStatusResponse()
            for region in self.plane.shared_memory.status(request.name):
                reply.regions[region.name].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**vars(region)))
            return reply

        return await _guard(context, work)

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def work() -> Any:
            self.plane.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
            return pb.SystemSharedMemoryRegisterResponse()

        return await _guard(context, work)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def work() -> Any:
            self.plane.shared_memory.unregister(request.name)
            return pb.SystemSharedMemoryUnregisterResponse()

        return await _guard(context, work)

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def work() -> Any:
            if request.name:  # none is ever registered
                raise InferenceError(400, f"Unable to find cuda shared memory region: {request.name!r}")
            return pb.CudaSharedMemoryStatusResponse()

        return await _guard(context, work)

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:  # noqa: N802
        async def work() -> Any:
            raise InferenceError(501, CUDA_UNSUPPORTED)

        return await _guard(context, work)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.CudaSharedMemoryUnregisterResponse()  # nothing to forget: none is ever registered

    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        arrival = time.monotonic_ns()  # the message is in: from here the call's time counts

        async def work() -> Any:
            self.plane.admit_call("grpc")
            return await self._infer(request, arrival, context)

        return await _guard(context, work)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:  # noqa: N802
        """Triton's bidirectional stream (``tritonclient``'s ``async_stream_infer``): the requests run
        side by side, each answered on the stream once done (the client matches answers by id), a
        failure as that answer's ``error_message``. Every request read is answered before the stream ends."""
        answers: asyncio.Queue[Any] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()
        outstanding, read_all = 0, False

        async def answer(request: Any, arrival_ns: int) -> None:
            try:
                self.plane.admit_call("grpc")
                reply = await self._infer(request, arrival_ns, context)
                await answers.put(pb.ModelStreamInferResponse(infer_response=reply))
                return
            except InferenceError as error:
                message = error.message
            except Exception as error:
                log.exception("internal error in a gRPC stream")
                message = f"internal error: {type(error).__name__}: {error}"  # as the unary calls say it
            response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
            await answers.put(pb.ModelStreamInferResponse(error_message=message, infer_response=response))

        async def read() -> None:
            nonlocal outstanding
            try:
                async for request in requests:
                    outstanding += 1
                    task = asyncio.create_task(answer(request, time.monotonic_ns()))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            finally:
                await answers.put(None)  # no more requests: end once the last is answered

        reader = asyncio.create_task(read())
        try:
            while not (read_all and outstanding == 0):
                reply = await answers.get()
                if reply is None:
                    read_all = True
                    continue
                outstanding -= 1
                yield reply
        finally:  # the client went away: nobody is left to answer
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def _infer(self, request: Any, arrival_ns: int | None = None, context: Any = None) -> Any:
        """One ``ModelInferRequest`` through the data plane; ``InferenceError`` for a refusal. ``context``: the
        call's, whose metadata may carry a ``traceparent`` (read only when tracing is on)."""
        limits = self.plane.limits
        size = request.ByteSize()
        if size > limits.max_body_bytes:  # read (up to gRPC's own limit) so that a stream goes on past it
            raise InferenceError(
                413, f"request message of {size} bytes exceeds the limit of {limits.max_body_bytes} (max_body_bytes)"
            )
        _check_strings(request, limits)
        parameters = _parameters(request.parameters)
        regions = self.plane.shared_memory
        inputs = _inputs(request, self.plane.limits, regions)
        self.plane.limits.check_count("outputs", len(request.outputs))
        requested, placed = {}, {}
        for output in request.outputs:
            output_parameters = _parameters(output.parameters)
            requested[output.name] = class_count(output_parameters, output.name[:64])
            if (where := placement(output_parameters, f"output {output.name[:64]!r}")) is not None:
                regions.check(where, f"output {output.name[:64]!r}")  # refused before the model runs
                placed[output.name] = where
        headers = None
        if self.plane.tracing is not None and context is not None:
            headers = {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
        served, outputs = await self.plane.infer(
            request.model_name,
            request.model_version or None,
            inputs,
            requested or None,
            parameters,
            arrival_ns,
            headers,
        )
        reply = pb.ModelInferResponse(model_name=request.model_name, model_version=str(served.version), id=request.id)
        for tensor in outputs:
            added = reply.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            raw = serialize_bytes(tensor.data) if tensor.datatype == "BYTES" else tensor.data.tobytes()
            if (where := placed.get(tensor.name)) is not None:
                _place(regions, where, raw, added)
                raw = b""  # kept in line: tritonclient finds an output's contents by its position
            reply.raw_output_contents.append(raw)
        return reply


def _check_strings(request: Any, limits: RequestLimits) -> None:
    """``max_string_bytes`` for a ``ModelInferRequest``'s strings, as over HTTP for the JSON document's:
    the id, names, and parameter names and texts (input names: when their tensor is decoded)."""
    strings = [("the request id", request.id), ("the model name", request.model_name),
               ("the model version", request.model_version)]  # fmt: skip
    strings += [(f"outputs[{i}].name", output.name) for i, output in enumerate(request.outputs)]
    holders = [("the request", request), *((f"inputs[{i}]", t) for i, t in enumerate(request.inputs)),
               *((f"outputs[{i}]", t) for i, t in enumerate(request.outputs))]  # fmt: skip
    for where, holder in holders:
        for key, value in holder.parameters.items():
            strings.append((f"a parameter name of {where}", key))
            if value.WhichOneof("parameter_choice") == "string_param":
                strings.append((f"parameter {key[:64]!r} of {where}", value.string_param))
    for what, text in strings:
        limits.check_string(what, text)


def _place(regions: SharedMemoryRegions, where: Placement, raw: bytes, output: Any) -> None:
    """Write an output's bytes to its shared-memory region, and say so in its entry of the reply."""
    regions.write(where, raw, f"output {output.name[:64]!r}")
    output.parameters["shared_memory_region"].string_param = where.region
    output.parameters["shared_memory_byte_size"].int64_param = len(raw)


def _inputs(request: Any, limits: RequestLimits, regions: SharedMemoryRegions) -> list[Tensor]:
    limits.check_count("inputs", len(request.inputs))
    placements = [placement(_parameters(t.parameters), f"input {t.name[:64]!r}") for t in request.inputs]
    raw_contents = list(request.raw_input_contents)  # one per input not in shared memory, in order (tritonclient's)
    carried = sum(where is None for where in placements)
    if raw_contents and len(raw_contents) != carried:
        raise InferenceError(400, f"{len(raw_contents)} raw_input_contents for {carried} inputs not in shared memory")
    raw_of = iter(raw_contents)
    tensors, count = [], 0
    for entry, where in zip(request.inputs, placements, strict=True):
        shape = list(entry.shape)
        given = [f.name for f, _ in entry.contents.ListFields()] if entry.HasField("contents") else []
        if (raw_contents or where is not None) and given:  # two sources of one tensor's data: which is meant?
            source = "shared_memory_region" if where is not None else "raw_input_contents"
            raise InferenceError(400, f"input {entry.name[:64]!r}: contents must be empty with {source}")
        if where is not None:
            raw = regions.read(where, f"input {entry.name[:64]!r}")
            tensor, count = decode_tensor(entry.name, entry.datatype, shape, None, raw, limits, count)
        elif raw_contents:
            tensor, count = decode_tensor(entry.name, entry.datatype, shape, None, next(raw_of), limits, count)
        else:
            field = _CONTENTS.get(entry.datatype)
            if field is None:
                raise InferenceError(
                    400, f"input {entry.name[:64]!r}: datatype {entry.datatype[:64]} needs raw_input_contents"
                )
            if [f for f in given if f != field]:
                named = ", ".join(given)
                raise InferenceError(
                    400, f"input {entry.name[:64]!r}: {entry.datatype} data goes in {field}, got {named}"
                )
            values = np.asarray(getattr(entry.contents, field))
            tensor, count = decode_tensor(entry.name, entry.datatype, shape, values, None, limits, count)
        tensors.append(tensor)
    return tensors


class _Authorize(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses a call without the bearer token its scope needs (metadata ``authorization``)."""

    def __init__(self, access: Access) -> None:
        self._access = access

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        metadata = dict(details.invocation_metadata or ())
        if self._access.allows(grpc_scope(details.method), metadata.get("authorization")):
            return await continuation(details)

        async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED)

        if details.method.endswith("/ModelStreamInfer"):  # a stream's handler must be a stream's
            return grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)


def channel_options(limits: RequestLimits, share_port: bool) -> list[tuple[str, int]]:
    """gRPC core's settings for ``limits``. A message over ``max_body_bytes`` but within twice it is read
    and refused alone (RESOURCE_EXHAUSTED; a stream goes on); gRPC ends the call of a larger one, with the
    same code. Connections: the HTTP frontend's header, idle and age bounds in gRPC's terms."""

    def ms(seconds: float) -> int:  # 0 would turn a bound off (or ping without pause)
        return max(1, min(round(seconds * 1000), 2**31 - 1))

    return [
        ("grpc.max_receive_message_length", min(2 * limits.max_body_bytes, 2**31 - 1)),
        ("grpc.max_send_message_length", 256 * 1024 * 1024),
        ("grpc.max_metadata_size", limits.max_header_bytes),
        ("grpc.so_reuseport", int(share_port)),
        ("grpc.server_handshake_timeout_ms", ms(limits.header_timeout_s)),  # a connection that never speaks HTTP/2
        ("grpc.max_connection_idle_ms", ms(limits.idle_timeout_s)),
        ("grpc.max_connection_age_ms", ms(limits.max_connection_age_s)),
        ("grpc.max_connection_age_grace_ms", ms(limits.max_connection_age_grace_s)),
        # Ping a connection with calls under way as often as an idle one is closed: a client gone without a
        # word (its host lost) is found within 20 s of the ping, not held until its stream's age runs out.
        ("grpc.keepalive_time_ms", ms(limits.idle_timeout_s)),
        ("grpc.keepalive_timeout_ms", 20_000),
    ]


async def start_grpc(plane: DataPlane, address: str, share_port: bool = False) -> grpc.aio.Server:
    """Serve on ``address`` (``host:port``); returns the started server. ``share_port``: with other
    frontend processes (SO_REUSEPORT, which gRPC sets unless told not to: a second server on a port in
    use would otherwise start and take half its calls)."""
    plane.gate.watch()
    interceptors = [_Authorize(plane.access)] if plane.access.enabled else []
    server = grpc.aio.server(interceptors=interceptors, options=channel_options(plane.limits, share_port))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(plane), server)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:  # grpcio's "Failed to bind to address"
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address} (is the port in use?)")
    await server.start()
    return server
