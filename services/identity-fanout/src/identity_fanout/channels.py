"""LISTEN/NOTIFY channels: a writer wakes the worker (tasks) or the relay (outbox) at once.

One way to listen (`listen`, used by the worker's wake-up session and the relay's lane
session) and one way to notify (`notify`, in the writer's transaction: delivered on commit).
"""

from __future__ import annotations

from typing import Final

from psycopg import Connection, sql

from pin_runtime.sql import load_queries

__all__ = ["OUTBOX_CHANNEL", "TASKS_CHANNEL", "listen", "notify"]

TASKS_CHANNEL: Final = "identity_access_fanout_tasks"
"""Notified on enqueue, on a split and on a replay; the payload is the task id."""
OUTBOX_CHANNEL: Final = "identity_outbox"
"""Notified in every transaction that writes outbox rows; the relay listens."""

_q = load_queries("identity_fanout", "sql/channels.sql")


def listen(conn: Connection[tuple[object, ...]], channel: str) -> None:
    """Subscribe an autocommit connection to `channel` (quoted as an identifier)."""
    conn.execute(_q.compose("listen", channel=sql.Identifier(channel)))


def notify(conn: Connection[tuple[object, ...]], channel: str, payload: str = "") -> None:
    """Wake the listeners of `channel` when the caller's transaction commits."""
    conn.execute(_q.notify, {"channel": channel, "payload": payload})
