"""Deleting acknowledged outbox rows beside the relay's flow, on a connection of its own.

The relay's loop reads, produces and settles; the DELETE of what the broker acknowledged
runs in this thread meanwhile, so the loop never waits for it. Deleting an acknowledged row
is right whoever holds its lane, so this connection needs no lock. Until its DELETE is done
a row still counts as pending (`pending`): the loop does not read its lanes from the head
again nor hand them over before `flush()`, which keeps a row from being sent twice by
this relay or by the next holder. A failed DELETE is retried (the rows are only sent again
if the relay stops first: at-least-once).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from identity_fanout.outbox.log import log as _log
from identity_fanout.outbox.metrics import RelayMetrics
from identity_fanout.outbox.report import report_published
from pin_runtime.logging import log_event
from pin_runtime.postgres import LazyConnection
from pin_runtime.sql import load_queries

__all__ = ["Deleter"]

_q = load_queries("identity_fanout", "outbox/sql/relay.sql")

RETRY_PAUSE: Final = 0.5


class Deleter:
    """A thread deleting submitted batches of acknowledged ids, in submission order."""

    def __init__(
        self, connect: Callable[[], psycopg.Connection[TupleRow]], metrics: RelayMetrics
    ) -> None:
        self._metrics = metrics
        self._queue: deque[tuple[list[int], list[str]]] = deque()
        self._pending = 0
        self._done = threading.Condition()
        self._closing = False
        self._conn = LazyConnection(connect)
        self._thread: threading.Thread | None = None
        self.published = 0
        self.last_id: int | None = None
        self.error: str | None = None

    @property
    def pending(self) -> int:
        """Acknowledged rows submitted and not deleted yet."""
        return self._pending

    def submit(self, ids: list[int], topics: Sequence[str]) -> None:
        with self._done:
            self._queue.append((ids, list(topics)))
            self._pending += len(ids)
            self._done.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="outbox-deleter", daemon=True)
            self._thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait until everything submitted is deleted; False if `timeout` ran out first."""
        with self._done:
            return self._done.wait_for(lambda: self._pending == 0, timeout)

    def take_published(self) -> tuple[int, int | None]:
        """Rows deleted and the highest id since the last call."""
        with self._done:
            published, last = self.published, self.last_id
            self.published, self.last_id = 0, None
        return published, last

    def close(self, timeout: float) -> None:
        self.flush(timeout)
        with self._done:
            self._closing = True
            self._done.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._done:
            self._closing = False
        self._conn.discard()

    def _run(self) -> None:
        while True:
            with self._done:
                self._done.wait_for(lambda: bool(self._queue) or self._closing)
                if not self._queue:
                    return
                ids, topics = self._queue[0]
            try:
                deleted = self._delete(ids)
            except Exception as exc:  # an outage: keep the ids, try again
                log_event(_log, "outbox delete failed", logging.WARNING, error=str(exc))
                self.error = str(exc)
                self._conn.discard()
                with self._done:
                    if self._done.wait_for(lambda: self._closing, RETRY_PAUSE):
                        return
                continue
            if deleted != len(ids):
                log_event(
                    _log,
                    "outbox rows already gone",
                    logging.WARNING,
                    expected=len(ids),
                    deleted=deleted,
                )
            report_published(self._metrics, ids, topics)
            with self._done:
                self._queue.popleft()
                self.error = None
                self._pending -= len(ids)
                self.published += len(ids)
                self.last_id = max(self.last_id or 0, *ids)
                self._done.notify_all()

    def _delete(self, ids: list[int]) -> int:
        # An array literal built in C: psycopg would dump a list of ints element by element.
        literal = "{" + ",".join(map(str, ids)) + "}"
        return self._conn.get().execute(_q.delete_published, {"ids": literal}).rowcount
