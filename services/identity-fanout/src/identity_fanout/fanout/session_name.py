"""The name a worker process's database sessions carry: how `identity-fanout status`
counts the live workers (from pg_stat_activity) without loading the worker."""

from __future__ import annotations

import os
import socket
from typing import Final

__all__ = ["WORKER_SESSION_PREFIX", "worker_session_name"]

WORKER_SESSION_PREFIX: Final = "identity-fanout-worker@"
"""The start of every database session a worker process opens (its pool's and its
LISTEN's): `identity-fanout status` counts the live workers by these names."""
_NAME_BYTES: Final = 63  # what the server keeps of an application_name (NAMEDATALEN - 1)


def worker_session_name() -> str:
    """`identity-fanout-worker@HOST:PID`, one name per worker process (a pod's hostname
    tells pods apart, the pid processes on one host); a long host is cut, never the pid."""
    suffix = f":{os.getpid()}"
    room = _NAME_BYTES - len(WORKER_SESSION_PREFIX) - len(suffix)
    host = socket.gethostname().encode()[: max(room, 0)].decode(errors="ignore")
    return f"{WORKER_SESSION_PREFIX}{host}{suffix}"
