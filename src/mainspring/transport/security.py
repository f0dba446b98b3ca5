"""An authenticated, encrypted controller-worker channel from one shared secret (ZeroMQ CURVE).

Both ends derive CURVE key pairs from the secret: the controller's pair, which a worker needs
to reach it, and the workers' pair, which the controller's ZAP handler accepts and nothing
else. A process without the secret cannot complete the handshake, so it cannot join as a
worker nor read actions and tensors off the wire. Without a secret the channel is plain TCP
(fine on loopback and on a private network; the controller warns otherwise).
"""

from __future__ import annotations

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
UNEXPLAINED_BEFORE_LOG = 5  # failures without a named cause in a row before one is reported as it is


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


def secure_worker(socket: zmq.Socket[Any], secret: str) -> None:
    """Make ``socket`` (before connect) a CURVE client of the controller that holds ``secret``."""
    public, private = curve_pair(secret, "worker")
    socket.curve_serverkey = curve_pair(secret, "controller")[0]
    socket.curve_publickey = public
    socket.curve_secretkey = private


async def report_failed_handshakes(monitor: zmq.asyncio.Socket, endpoint: str, has_secret: bool) -> None:
    """Log connections to the controller that fail their handshake (``monitor``: the socket's
    ``HANDSHAKE_FAILED`` events). A worker whose secret differs, or that has one where the
    controller has none (or the reverse), is otherwise refused in silence on both sides."""
    failed, unexplained, last_logged = 0, 0, float("-inf")
    while True:
        event = parse_monitor_message(await monitor.recv_multipart())
        failed += 1
        if time.monotonic() - last_logged < HANDSHAKE_LOG_EVERY_S:
            continue
        if event["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            cause = ("the connecting side has no worker secret; this controller has one" if has_secret
                     else "the connecting side has a worker secret; this controller has none")  # fmt: skip
        elif event["value"] == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            cause = "its worker secret is not this controller's"
        else:
            # A connection closed mid-handshake (NO_DETAIL, errno 32) often comes first, and the
            # retry a moment later names the cause: say it without one only when it keeps coming.
            unexplained += 1
            if unexplained < UNEXPLAINED_BEFORE_LOG:
                continue
            cause = f"{zmq.Event(event['event']).name}, {event['value']}"
        unexplained = 0
        log.warning("a connection to %s failed the handshake (%d since the last such warning): %s (%s)",
                    endpoint, failed, cause, SECRET_ENV)  # fmt: skip
        failed, last_logged = 0, time.monotonic()
