"""Waiting for work: NOTIFY on enqueue (or split), else the polling interval."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import psycopg
from psycopg.rows import TupleRow

from identity_fanout.channels import TASKS_CHANNEL, listen
from pin_runtime.logging import log_event
from pin_runtime.postgres import LazyConnection, SessionLimits, connect

_log = logging.getLogger(__name__)


@dataclass(eq=False, kw_only=True)
class Wakeup:
    """A LISTEN session of its own (bounded like the pool's), reopened after a failure."""

    dsn: str
    session: SessionLimits
    stop: threading.Event
    beat: Callable[[], None]
    clock: Callable[[], float] = time.monotonic
    _listener: LazyConnection = field(init=False)

    def __post_init__(self) -> None:
        self._listener = LazyConnection(
            lambda: connect(self.dsn, self.session),
            prepare=lambda conn: listen(conn, TASKS_CHANNEL),
        )

    def wait(self, polling_interval: timedelta) -> None:
        """Sleep until NOTIFY, the polling interval, or a stop request, whichever is first."""
        deadline = self.clock() + polling_interval.total_seconds()
        listener = self._listen()
        while not self.stop.is_set():
            remaining = deadline - self.clock()
            if remaining <= 0:
                return
            # Short slices so a stop request is seen within half a second.
            slice_seconds = min(remaining, 0.5)
            if listener is None:
                self.stop.wait(slice_seconds)
                continue
            try:
                for _ in listener.notifies(timeout=slice_seconds, stop_after=1):
                    return
            except psycopg.Error:
                self._listener.discard()
                listener = None
            self.beat()

    def _listen(self) -> psycopg.Connection[TupleRow] | None:
        try:
            return self._listener.get()
        except psycopg.Error as exc:
            log_event(_log, "listen failed; polling only", logging.WARNING, exception=repr(exc))
            self._listener.discard()
            return None

    def close(self) -> None:
        self._listener.close()
