"""Free loopback ports for processes a test, the demo or a benchmark starts.

The port is free when this returns; another process may take it before the caller binds it,
which on a test machine is rare enough that callers simply use it (the service fails to
start with a clear error otherwise). Nothing listens on it either, which is what a test of a
refused connection needs.
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
