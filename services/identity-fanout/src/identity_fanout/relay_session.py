"""The relay's database session: one connection that holds the relay lock and LISTENs.

The lock lives on the connection that also reads, deletes and quarantines rows, so losing
that connection loses the lock (and a standby takes over) instead of two relays publishing.
Every wait of the session is bounded by the service's `SessionLimits` (statement and lock
timeouts, idle-in-transaction timeout, TCP keepalives on both ends: the server notices a
vanished relay and frees its lock within about idle + interval * count seconds).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from identity_fanout import relay_queries as q
from pin_runtime.logging import log_event
from pin_runtime.postgres import SessionLimits

__all__ = ["LockedSession"]

_log = logging.getLogger(__name__)

WAKE_SLICE: Final = 0.5
"""Longest uninterruptible wait: bounds the reaction to a stop request."""


class LockedSession:
    """An autocommit connection, the advisory lock `lock_key` on it, LISTEN `channel`.

    `connection()` (re)connects lazily; `acquire()` takes the lock if free; `drop()` after
    any error forgets the connection and with it the lock. `on_active(bool)` follows the
    lock (the relay's `identity_outbox_relay_active` gauge).
    """

    def __init__(
        self,
        dsn: str,
        *,
        lock_key: int,
        channel: str,
        application_name: str,
        limits: SessionLimits,
        on_active: Callable[[bool], None] | None = None,
    ) -> None:
        self._dsn = dsn
        self._lock_key = lock_key
        self._channel = channel
        self._application_name = application_name[:63]
        self._limits = limits
        self._on_active = on_active or (lambda _active: None)
        self._conn: psycopg.Connection[TupleRow] | None = None
        self._holding = False
        self._standby_logged = False

    @property
    def holding(self) -> bool:
        """True while this session holds the lock."""
        return self._holding

    def connection(self) -> psycopg.Connection[TupleRow]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        self.drop()
        self._conn = psycopg.connect(
            self._dsn,
            autocommit=True,  # each statement its own transaction; LISTEN delivers at once
            connect_timeout=5,
            application_name=self._application_name,
            **self._limits.connect_kwargs(),
        )
        return self._conn

    def acquire(self) -> bool:
        """Take the lock if it is free (True), or stay standby (False)."""
        if self._holding:
            return True
        conn = self.connection()
        row = conn.execute(q.TRY_LOCK, {"key": self._lock_key}).fetchone()
        if row is None or not row[0]:
            self._on_active(False)
            if not self._standby_logged:
                log_event(_log, "relay standby", lockKey=self._lock_key)
                self._standby_logged = True
            return False
        # LISTEN before the first read: a row committed after the read still wakes us.
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        self._holding = True
        self._standby_logged = False
        self._on_active(True)
        log_event(_log, "relay active", lockKey=self._lock_key, pid=conn.info.backend_pid)
        return True

    def wait_for_notify(
        self, timeout: float, *, stop: threading.Event, on_tick: Callable[[], None]
    ) -> None:
        """Sleep until a writer's NOTIFY, `timeout` or `stop`, whichever comes first."""
        conn = self._conn
        if conn is None:
            return
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                for _ in conn.notifies(timeout=min(remaining, WAKE_SLICE), stop_after=1):
                    return
            except Exception:
                self.drop()
                raise
            on_tick()

    def drop(self) -> None:
        """Forget the connection after an error (closing it frees the lock server-side)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        if self._holding:
            log_event(_log, "relay lock lost", logging.WARNING, lockKey=self._lock_key)
        self._set_inactive()

    def close(self) -> None:
        """Release the lock and close the connection (a graceful stop)."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                if self._holding:
                    conn.execute(q.UNLOCK, {"key": self._lock_key})
            except psycopg.Error:
                pass  # closing the connection releases the lock all the same
            finally:
                conn.close()
        self._set_inactive()

    def _set_inactive(self) -> None:
        self._holding = False
        self._standby_logged = False
        self._on_active(False)
