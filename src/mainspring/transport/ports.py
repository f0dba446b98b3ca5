"""Whether a TCP port is free to listen on, asked before binding it with SO_REUSEPORT (which would
quietly share it with whatever holds it)."""

from __future__ import annotations

import socket


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise OSError naming ``what`` when something listens on ``host:port`` already."""
    if port == 0:
        return
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is no user
            try:
                probe.bind(address)
            except OSError as error:
                raise OSError(f"cannot listen for {what} on {host}:{port}: {error.strerror}") from None
