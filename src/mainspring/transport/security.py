"""An authenticated, encrypted controller-worker channel from one shared secret (ZeroMQ CURVE).

Both ends derive CURVE key pairs from the secret: the controller's pair, which a worker needs
to reach it, and the workers' pair, which the controller's ZAP handler accepts and nothing
else. A process without the secret cannot complete the handshake, so it cannot join as a
worker nor read actions and tensors off the wire. Without a secret the channel is plain TCP
(fine on loopback and on a private network; the controller warns otherwise).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)

SECRET_ENV = "MAINSPRING_WORKER_SECRET"
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
HANDSHAKE_LOG_EVERY_S = 10.0  # a worker retrying with the wrong secret is reported this often, with a count
UNEXPLAINED_WAIT_S = 1.0  # how long a handshake closed without a cause waits for a retry that names one


def curve_pair(secret: str, role: str) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys of ``role`` ("controller" or "worker") for this shared secret."""
    seed = hashlib.sha256(f"mainspring-curve-v1 {role} {secret}".encode()).digest()
    secret_key = z85.encode(seed)
    return zmq.curve_public(secret_key), secret_key


class _WorkersOnly:
    """ZAP credentials check: only the workers' public key may connect."""

    def __init__(self, worker_public: bytes) -> None:
        self._worker_public = worker_public

    def callback(self, domain: str, key: bytes) -> bool:
        if key != self._worker_public:
            log.warning("refused a worker connection with a key not derived from the shared secret")
            return False
        return True


def secure_controller(context: zmq.asyncio.Context, socket: zmq.asyncio.Socket, secret: str) -> AsyncioAuthenticator:
    """Make ``socket`` (before bind) a CURVE server that admits only holders of ``secret``;
    returns the running authenticator (stop it when the socket closes)."""
    authenticator = AsyncioAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve_callback("*", _WorkersOnly(curve_pair(secret, "worker")[0]))
    _, server_secret = curve_pair(secret, "controller")
    socket.curve_secretkey = server_secret
    socket.curve_server = True
    return authenticator


def tcp_secret(endpoint: str, secret: str) -> str:
    """The secret a channel on ``endpoint`` uses: a local ``ipc://`` channel (a folder only this user may
    enter) needs none; a TCP one the worker secret, where set."""
    return secret if endpoint.startswith("tcp://") else ""


def secure_publisher(socket: zmq.Socket[Any], secret: str) -> None:
    """Make ``socket`` (before bind) a CURVE server that only holders of ``secret`` can read and that no
    one without it can pose as (subscribers check its key: ``secure_worker``)."""
    socket.curve_secretkey = curve_pair(secret, "controller")[1]
    socket.curve_server = True


def secure_worker(socket: zmq.Socket[Any], secret: str) -> None:
    """Make ``socket`` (before connect) a CURVE client of the controller that holds ``secret``."""
    public, private = curve_pair(secret, "worker")
    socket.curve_serverkey = curve_pair(secret, "controller")[0]
    socket.curve_publickey = public
    socket.curve_secretkey = private


async def report_failed_handshakes(
    monitor: zmq.asyncio.Socket, endpoint: str, has_secret: bool, every_s: float = HANDSHAKE_LOG_EVERY_S
) -> None:
    """Log connections to the controller that fail their handshake (``monitor``: the socket's
    ``HANDSHAKE_FAILED`` events). A worker whose secret differs, or that has one where the
    controller has none (or the reverse), is otherwise refused in silence on both sides.

    The first failure is logged at once; those within ``every_s`` of a warning are counted, and one
    warning tells them (with the latest cause) as soon as ``every_s`` has passed, not when a later
    failure happens to come. A peer that saw the mismatch first closes mid-handshake, and this side
    gets NO_DETAIL (errno 32) with no cause; a retry soon after often names it, so such an event waits
    ``UNEXPLAINED_WAIT_S`` for one before it is reported with the likely cause."""
    failed, last_logged = 0, float("-inf")  # failures since the last warning; when that was
    cause: str | None = None  # the latest cause not told yet
    unexplained: tuple[dict[str, int], float] | None = None  # a close without a cause, and when it came
    while True:
        due = [unexplained[1] + UNEXPLAINED_WAIT_S] if unexplained is not None else []
        if cause is not None:
            due.append(last_logged + every_s)
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        try:
            frames = await asyncio.wait_for(monitor.recv_multipart(), timeout)
        except TimeoutError:
            pass
        else:
            message = parse_monitor_message(frames)
            event = {"event": int(message["event"]), "value": int(message["value"])}
            failed += 1
            named = _handshake_cause(event, has_secret, final=False)
            if named is not None:
                cause, unexplained = named, None
            elif unexplained is None:
                unexplained = event, time.monotonic()
        now = time.monotonic()
        if unexplained is not None and now - unexplained[1] >= UNEXPLAINED_WAIT_S:  # no retry named the cause
            cause, unexplained = _handshake_cause(unexplained[0], has_secret, final=True), None
        if cause is not None and now - last_logged >= every_s:
            log.warning("a connection to %s failed the handshake (%d since the last such warning): %s (%s)",
                        endpoint, failed, cause, SECRET_ENV)  # fmt: skip
            failed, cause, last_logged = 0, None, now


def _handshake_cause(event: dict[str, int], has_secret: bool, final: bool) -> str | None:
    """Why a handshake failed, in words; None for a close without a cause while a retry may still name it."""
    mismatch = ("the connecting side has no worker secret; this controller has one" if has_secret
                else "the connecting side has a worker secret; this controller has none")  # fmt: skip
    if event["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return mismatch
    if event["value"] == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "its worker secret is not this controller's"
    described = f"{zmq.Event(event['event']).name}, {event['value']}"
    if event["event"] != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return described
    if not final:
        return None
    likely = "the connecting side has no worker secret or another one" if has_secret else mismatch
    return f"the peer closed the connection during the handshake ({described}), as when {likely}"
