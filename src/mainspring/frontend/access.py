"""Who may call what: an optional bearer token, compared in constant time.

Health stays open (orchestrators probe it without credentials). With a token set, the
repository API (loading and unloading models changes what the server runs) and the registration of
shared memory (it maps a client's memory into the server) need it; with
``protect_inference`` too, so does everything else: inference, metadata, statistics, metrics.
"""

from __future__ import annotations

import enum
import hmac


class Scope(enum.Enum):
    HEALTH = "health"
    REPOSITORY = "repository"
    INFERENCE = "inference"  # and metadata, statistics, metrics


UNAUTHORIZED = "missing or wrong bearer token (set by auth_token; send 'Authorization: Bearer <token>')"


class Access:
    def __init__(self, token: str = "", protect_inference: bool = False) -> None:
        if protect_inference and not token:
            raise ValueError("auth_inference needs auth_token to be set")
        self._expected = token.encode() if token else None
        self._protect_inference = protect_inference

    @property
    def enabled(self) -> bool:
        return self._expected is not None

    def allows(self, scope: Scope, authorization: str | None) -> bool:
        """Whether a call in ``scope`` carrying this ``Authorization`` value may proceed."""
        if self._expected is None or scope is Scope.HEALTH:
            return True
        if scope is Scope.INFERENCE and not self._protect_inference:
            return True
        scheme, _, credentials = (authorization or "").partition(" ")
        given = credentials.encode("utf-8", "surrogateescape")
        # The scheme is case-insensitive (RFC 9110, 11.1): "bearer" is as good as "Bearer".
        return scheme.lower() == "bearer" and hmac.compare_digest(given, self._expected)


_SHARED_MEMORY = ("/v2/systemsharedmemory/", "/v2/cudasharedmemory/")


def http_scope(path: str) -> Scope:
    if path.startswith("/v2/health/") or (path.startswith("/v2/models/") and path.endswith("/ready")):
        return Scope.HEALTH  # as gRPC's ServerLive, ServerReady and ModelReady
    if path.startswith("/v2/repository/") or (path.startswith(_SHARED_MEMORY) and not path.endswith("/status")):
        return Scope.REPOSITORY  # registering shared memory maps host memory into the server: as a model load
    return Scope.INFERENCE


def grpc_scope(method: str) -> Scope:
    """``method`` is the full name, ``/inference.GRPCInferenceService/ModelInfer``."""
    name = method.rsplit("/", 1)[-1]
    if name in ("ServerLive", "ServerReady", "ModelReady"):
        return Scope.HEALTH
    if name.startswith("Repository") or (name.startswith(("SystemSharedMemory", "CudaSharedMemory"))
                                         and not name.endswith("Status")):  # fmt: skip
        return Scope.REPOSITORY
    return Scope.INFERENCE
