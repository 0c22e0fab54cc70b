"""Loopback ports: free ones for processes a test, the demo or a benchmark starts, and
whether something listens on one.

The port is free when this returns; another process may take it before the caller binds it,
which on a test machine is rare enough that callers simply use it (the service fails to
start with a clear error otherwise). Nothing listens on it either, which is what a test of a
refused connection needs.
"""

from __future__ import annotations

import socket

__all__ = ["free_port", "listens"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listens(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    """Whether something accepts a TCP connection on ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        return sock.connect_ex((host, port)) == 0
