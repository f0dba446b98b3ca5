"""The data plane shared by the HTTP and gRPC frontends (as MLServer's).

It validates requests against each model's config, turns a request of N samples into N
scheduler requests with one deadline, and maps every answer to outputs or to one error
type with an HTTP status (``InferenceError``); each transport maps that status once.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

import mainspring
from mainspring.frontend.access import Access
from mainspring.frontend.connections import DroppedClients
from mainspring.frontend.errors import InferenceError
from mainspring.frontend.extensions import check_priority, classify, refuse_sequence
from mainspring.frontend.limits import RequestLimits
from mainspring.frontend.port import ControllerPort, ServedModel, ServiceError
from mainspring.frontend.shared_memory import SharedMemoryRegions
from mainspring.frontend.shedding import SHED, ArrivalGate, target_lag_ns
from mainspring.frontend.tensors import Tensor, decode_tensor
from mainspring.models.errors import ModelLoadError
from mainspring.models.repository import ModelRepository
from mainspring.protocol import Outcome
from mainspring.protocol.requests import resolve_slo_ns, slo_problem
from mainspring.protocol.tensors import shape_matches
from mainspring.time import NS_PER_MS, NS_PER_US

if TYPE_CHECKING:  # imported only where tracing is on (the ``otel`` extra)
    from mainspring.telemetry.tracing import Tracing

log = logging.getLogger(__name__)

# Triton's platform names where Triton has one (what its clients and tools branch on); ours elsewhere.
PLATFORMS = {"onnx": "onnxruntime_onnx", "torchscript": "pytorch_libtorch"}


def platform(model_format: str) -> str:
    return PLATFORMS.get(model_format, f"pytorch_{model_format}")


EXTENSIONS = [
    "model_repository", "statistics", "binary_tensor_data", "parameters", "classification", "system_shared_memory",
]  # fmt: skip
__all__ = ["HTTP_STATUS", "DataPlane", "InferenceError", "Tensor", "decode_tensor"]


def unknown_model(name: str, version: str = "", serving: int | None = None) -> str:
    """Triton's words for a model (or version) not served: its clients' examples match on the start."""
    if not version:
        return f"Request for unknown model: '{name}' is not found"
    return f"Request for unknown model: '{name}' version {version} is not found (serving version {serving})"


_SERVICE_STATUS = {"not_found": 404, "invalid": 400, "unavailable": 503, "overloaded": 429}


class DataPlane:
    def __init__(
        self,
        service: ControllerPort,
        repo: ModelRepository | None = None,
        name: str = "mainspring",
        limits: RequestLimits | None = None,
        access: Access | None = None,
        shared_memory: SharedMemoryRegions | None = None,
        shed: bool = True,
        tracing: Tracing | None = None,
    ) -> None:
        self.service = service
        self.tracing = tracing  # a span per call, under the caller's traceparent; None: off
        self.repo = repo
        self.name = name
        self.limits = limits or RequestLimits()
        self.access = access or Access()
        self.shared_memory = shared_memory or SharedMemoryRegions()  # one per server: ``serve`` shares its folder
        self.dropped = DroppedClients(service.count_dropped_client)  # clients gone mid-request or cut off
        # Sheds at arrival while the loop runs late (``shed``: else it stays open: its share is never cut).
        self.gate = ArrivalGate(target_lag_ns(service.default_slo_ns), watching=shed)

    # --- health and metadata -----------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.service.accepting and self.service.device_count > 0

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.name, "version": mainspring.__version__, "extensions": EXTENSIONS}

    def model(self, name: str, version: str | None = None) -> ServedModel:
        self.limits.check_string("the model name", name)
        if version:
            self.limits.check_string("the model version", version)
        served = self.service.models.get(name)
        if served is None:
            # Workers tell the controller what they serve: before the first joins (a restart), a model
            # that may exist is unavailable for now, not unknown.
            if self.service.device_count == 0 and (self.repo is None or name in self.repo.models()):
                message = f"model {name!r} is not served yet: no worker is connected"
                raise InferenceError(503, message, Outcome.NO_WORKER)
            raise InferenceError(404, unknown_model(name))
        if version not in (None, "", str(served.version)):
            raise InferenceError(404, unknown_model(name, version, served.version))
        return served

    def model_ready(self, name: str, version: str | None = None) -> bool:
        try:
            self.model(name, version)
        except InferenceError:
            return False
        return self.ready()

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        served = self.model(name, version)
        config = served.config

        def specs(tensors: Sequence[Any]) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in tensors]

        return {
            "name": name,
            "versions": [str(served.version)],
            "platform": platform(config.format),
            "inputs": specs(config.inputs),
            "outputs": specs(config.outputs),
        }

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        served = self.model(name, version)
        config: dict[str, Any] = msgspec.to_builtins(served.config)
        config["max_batch_size"] = served.config.max_batch
        config["default_slo_ms"] = served.config.slo_ms or self.service.default_slo_ns / NS_PER_MS
        config["profile"] = served.profile.to_json()

        # Triton's fields beside ours, so that code written against Triton's config reads it
        # (e.g. ``config["input"][0]["data_type"]``); its dims leave out the batch dimension.
        def triton(tensors: Sequence[Any]) -> list[dict[str, Any]]:
            return [{"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": list(t.shape[1:])} for t in tensors]

        config["platform"] = platform(served.config.format)
        config["input"] = triton(served.config.inputs)
        config["output"] = triton(served.config.outputs)
        config["dynamic_batching"] = {"preferred_batch_size": list(served.config.batch_sizes)}
        return config

    async def model_stats(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Statistics of ``name`` (at ``version``, if given), or of every served model."""
        if name:
            self.model(name, version)  # unknown model or version: 404 before anything is asked
        names = [name] if name else sorted(self.service.models)
        stats = []
        for model in names:
            s = await self.service.model_statistics(model)
            served = self.service.models.get(model)
            if served is None:  # unloaded while its statistics were read (a remote frontend's await)
                if name:
                    raise InferenceError(404, unknown_model(name))
                continue  # asked for every model: the others are still answered
            stats.append({
                "name": model,
                "version": str(served.version),
                "last_inference": s.last_inference_ns // NS_PER_MS,
                "inference_count": s.inference_count,
                "execution_count": s.execution_count,
                "inference_stats": {
                    "success": {"count": s.success_count, "ns": s.success_ns},
                    "fail": {"count": s.fail_count, "ns": s.fail_ns},
                    "rejected": {"count": s.rejected_count},
                },
            })  # fmt: skip
        return {"model_stats": stats}

    # --- repository ----------------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model of the repository and those served, with its state; ``ready_only``: the served."""
        entries = {name: {"name": name, "version": str(m.version), "state": "READY", "reason": ""}
                   for name, m in self.service.models.items()}  # fmt: skip
        if self.repo is not None:
            for name in self.repo.models():
                if name not in entries:
                    reason = self.service.load_errors.get(name, "")
                    try:
                        version = str(self.repo.latest_version(name))
                    except ModelLoadError as error:  # e.g. a Triton version_policy naming no servable version
                        version, reason = "", reason or str(error)
                    entries[name] = {"name": name, "version": version, "state": "UNAVAILABLE", "reason": reason}
        return [entries[n] for n in sorted(entries) if not ready_only or entries[n]["state"] == "READY"]

    async def load(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        _repository_parameters(parameters or {}, "load", ())
        known = name in self.service.models or name in self.service.load_errors  # e.g. a worker's, unloaded
        if self.repo is not None and name not in self.repo.models() and not known:
            raise InferenceError(404, f"model {name!r} is not in the repository")
        served = self.service.models.get(name)
        try:
            if served is not None and (change := self._change_since(name, served)):
                # Triton's load of a loaded model: serve the change, refusing nothing meanwhile
                log.info("reloading %s (version %d served): %s", name, served.version, change)
                await self.service.reload_model(name)
            else:
                await self.service.load_model(name)
        except ServiceError as error:
            raise InferenceError(_SERVICE_STATUS[error.kind], str(error)) from None
        except ModelLoadError as error:
            raise InferenceError(400, str(error)) from None

    def _change_since(self, name: str, served: ServedModel) -> str:
        """How the repository's latest version of a served model differs from what is served ("" if not)."""
        if self.repo is None:
            return ""
        if name not in self.repo.models():
            return "it is no longer in the repository"
        try:
            version = self.repo.latest_version(name)
            config = self.repo.config(name, version)
        except ModelLoadError as error:
            return str(error)
        if version != served.version:
            return f"version {version} is the latest now"
        return "" if config == served.config else "its config differs"

    async def unload(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        # No model here has dependents (no ensembles): there is nothing more to unload either way.
        _repository_parameters(parameters or {}, "unload", ("unload_dependents",))
        try:
            await self.service.unload_model(name)
        except ServiceError as error:
            raise InferenceError(_SERVICE_STATUS[error.kind], str(error)) from None

    # --- inference -----------------------------------------------------------------------------
    def admit_call(self, transport: str) -> None:
        """429 at once for a call the arrival gate sheds (before its body is read: a refusal must cost far
        less than a call served)."""
        if not self.gate.admit():
            self.dropped.record(transport, SHED)
            raise InferenceError(429, self.gate.reason(), Outcome.OVERLOADED)

    async def infer(
        self,
        name: str,
        version: str | None,
        inputs: Sequence[Tensor],
        requested: Mapping[str, int] | None,
        parameters: Mapping[str, Any],
        arrival_ns: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[ServedModel, list[Tensor]]:
        """Run ``inputs`` on model ``name``; ``requested``: the outputs to return, each with the number of
        classes to return instead of its values (0: the values; ``classification``), or None for all.
        ``arrival_ns`` (``time.monotonic_ns``): when the call's first byte was read; the time since counts
        against its deadline. ``headers``: where the call's ``traceparent`` is, when tracing is on."""
        try:
            served = self.model(name, version)
        except InferenceError:
            # A frontend process's view may trail the controller's by a moment (a worker that just
            # joined, a model just loaded): ask it before refusing.
            if not await self.service.refresh():
                raise
            served = self.model(name, version)
        batch = self._check_inputs(served, inputs)
        wanted = self._check_outputs(served, requested)
        refuse_sequence(parameters)
        check_priority(parameters)
        slo_ns = self._slo_ns(served, parameters)
        by_name = {t.name: t.data for t in inputs}
        samples = [{name: array[i : i + 1] for name, array in by_name.items()} for i in range(batch)]
        try:
            waited = 0 if arrival_ns is None else max(0, time.monotonic_ns() - arrival_ns)
            if self.tracing is None:
                answers = await self.service.infer(name, samples, slo_ns, waited)
            else:
                call = functools.partial(self.service.infer, name, samples, slo_ns, waited)
                answers = await self.tracing.traced_call(call, name, len(samples), waited, headers or {})
        except ServiceError as error:
            outcome = Outcome.OVERLOADED if error.kind == "overloaded" else None
            if outcome is not None:
                self.gate.overloaded_elsewhere()
            raise InferenceError(_SERVICE_STATUS[error.kind], str(error), outcome) from None
        for response, _ in answers:
            if response.outcome is not Outcome.SERVED:
                raise InferenceError(HTTP_STATUS[response.outcome], response.reason or "failed", response.outcome)
        outputs = []
        for spec in served.config.outputs:
            if spec.name in wanted:
                data, datatype = np.concatenate([output[spec.name] for _, output in answers]), spec.datatype
                if wanted[spec.name]:  # classification: the top classes as text instead of the values
                    data, datatype = classify(spec.name, data, wanted[spec.name], spec.labels), "BYTES"
                outputs.append(Tensor(spec.name, datatype, list(data.shape), data))
        return served, outputs

    @staticmethod
    def _check_inputs(served: ServedModel, inputs: Sequence[Tensor]) -> int:
        specs = {s.name: s for s in served.config.inputs}
        given = [t.name for t in inputs]
        for name in given:
            if name not in specs:
                raise InferenceError(
                    400, f"unexpected input {name!r}; model {served.config.name!r} takes {list(specs)}"
                )
            if given.count(name) > 1:
                raise InferenceError(400, f"input {name!r} is given twice")
        missing = [name for name in specs if name not in given]
        if missing:  # Triton's words first: its tests match on them
            raise InferenceError(400, f"expected {len(specs)} inputs but got {len(given)} inputs for model "
                                      f"{served.config.name!r}: input {missing[0]!r} is missing")  # fmt: skip
        batches = set()
        for tensor in inputs:
            spec = specs[tensor.name]
            if tensor.datatype != spec.datatype:
                raise InferenceError(
                    400, f"input {tensor.name!r}: datatype {tensor.datatype} does not match {spec.datatype}"
                )
            if not shape_matches(spec.shape, tensor.shape):
                raise InferenceError(
                    400, f"input {tensor.name!r}: shape {tensor.shape} does not match {list(spec.shape)}"
                )
            if tensor.shape[0] < 1:
                raise InferenceError(400, f"input {tensor.name!r}: the batch dimension must be at least 1")
            try:
                spec.check_range(tensor.data)
            except ValueError as error:
                raise InferenceError(400, str(error)) from None
            batches.add(tensor.shape[0])
        if len(batches) > 1:
            raise InferenceError(400, f"inputs disagree on the batch dimension: {sorted(batches)}")
        return batches.pop()

    @staticmethod
    def _check_outputs(served: ServedModel, requested: Mapping[str, int] | None) -> dict[str, int]:
        names = {s.name for s in served.config.outputs}
        if not requested:
            return dict.fromkeys(names, 0)
        for name in requested:
            if name not in names:
                raise InferenceError(400, f"unknown output {name!r}; model {served.config.name!r} has {sorted(names)}")
        return dict(requested)

    def _slo_ns(self, served: ServedModel, parameters: Mapping[str, Any]) -> int:
        """The request's SLO (``requested_slo_ns``), else the model's or the server's."""
        return resolve_slo_ns(requested_slo_ns(parameters), served.config.slo_ms, self.service.default_slo_ns)


def requested_slo_ns(parameters: Mapping[str, Any]) -> int | None:
    """The SLO a request asks for: ``slo_ms``, else Triton's ``timeout`` (us; 0: none); None if neither.
    Each one given is checked, also one that another overrides (400 naming it)."""
    chosen = None
    for key, unit in (("slo_ms", NS_PER_MS), ("timeout", NS_PER_US)):
        if key not in parameters:
            continue
        value = parameters[key]
        if key == "timeout" and value == 0 and not isinstance(value, bool):
            continue  # Triton's "no timeout": the model's own SLO
        slo_ns = _duration_ns(key, value, unit)
        chosen = slo_ns if chosen is None else chosen
    return chosen


def _duration_ns(key: str, value: Any, unit: int) -> int:
    """A positive duration parameter of at most a day in ``unit`` ns, as ns (400 naming it otherwise)."""
    problem = slo_problem(f"parameter {key!r}", value, unit)
    if problem is not None:
        raise InferenceError(400, problem)
    duration: float = value
    return max(1, round(duration * unit))  # a positive SLO under 1 ns is one that cannot be met, not none


# The client's status for each outcome (gRPC maps these once more, in ``grpc.py``).
HTTP_STATUS = {
    Outcome.SERVED: 200,
    Outcome.DEADLINE_AT_ARRIVAL: 503,  # refused on arrival: retry later or with a longer SLO
    Outcome.OVERLOADED: 429,
    Outcome.EXPIRED_IN_QUEUE: 504,  # waited in the queue until the deadline could not be met
    Outcome.QUEUE_TIMEOUT: 504,
    Outcome.UNKNOWN_MODEL: 404,
    Outcome.DOES_NOT_FIT: 500,
    Outcome.NO_WORKER: 503,
    Outcome.MODEL_UNLOADED: 503,
    Outcome.WORKER_LOST: 503,
    Outcome.LOAD_FAILED: 500,
    Outcome.INPUT_FAILED: 400,
    Outcome.INFERENCE_FAILED: 500,
    Outcome.BAD_RESULT: 500,
    Outcome.SHUTTING_DOWN: 503,
}


def _repository_parameters(parameters: Mapping[str, Any], action: str, flags: tuple[str, ...]) -> None:
    """Refuse what a model load or unload cannot honour, rather than ignore it: Triton's config and
    file overrides (``config``, ``file:<path>``) and unknown names; ``flags`` take true or false."""
    for key, value in parameters.items():
        if key == "config" or key.startswith("file:"):
            raise InferenceError(
                400,
                f"parameter {key!r}: a {action} that overrides the model's config or files is not supported; "
                "change the model in the repository, then load it",
            )
        if key not in flags:
            known = ", ".join(flags) or "none"
            raise InferenceError(400, f"unknown parameter {key!r} for a model {action} (known: {known})")
        if not isinstance(value, bool):
            raise InferenceError(400, f"parameter {key!r} must be true or false, got {value!r}")
