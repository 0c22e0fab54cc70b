"""The outbox floor: an id below which no row is, nor ever will be.

Every statement that reads the outbox from its head (a relay's read with no cursor, the
backlog gauges, the writers' depth) starts at the floor instead of at the primary key's
first entry. Rows the relays deleted stay in the index until VACUUM; a scan marks an entry
dead once no snapshot can see its row, and skips it from then on. While a snapshot older than
the deletes is held (a session idle in a transaction, a prepared transaction, a slot) none
can be marked, and every read from the head walked all of them again, fetching each row
from the heap, where the floor makes the btree descend past them
(docs/design/identity-fanout.md "The outbox floor").

A lower bound must be right for rows committed late: a writer takes its id before it
commits, so a row may appear below ids already read and deleted. The floor therefore rises
only to what the database proves, in steps of `refresh` (one statement each, `floor.sql`):
a candidate is the last id handed out (`pg_sequence_last_value`) and the time just after;
once no transaction begun by then may still commit a row (pg_stat_activity, which needs
`pg_read_all_stats`), the floor rises to the first row at or below the candidate still
there, or past the candidate. Without the grant, or while an old writing transaction or a
prepared transaction exists, the floor stays where it is: slower, never wrong. A relay that
takes a lane over reads it from the floor, which holds for every lane. Ids are handed out
in order (the identity sequence's cache is 1: `test_outbox_floor_integration` checks).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Final, NamedTuple

from psycopg import Connection
from psycopg.rows import TupleRow

from identity_fanout.outbox.store import OutboxStore

__all__ = ["FLOOR_INTERVAL", "OutboxFloor"]

FLOOR_INTERVAL: Final = 0.5
"""Seconds between steps: the floor trails the deletes by about two of them."""


class _Candidate(NamedTuple):
    upto: int
    """The last id handed out when it was taken."""
    since: datetime
    """The database's clock just after."""


class OutboxFloor:
    """One process's floor of one outbox (`value`), raised by `refresh` at most every
    `interval` seconds; thread-safe (a refresh under way elsewhere is not waited for)."""

    def __init__(
        self,
        store: OutboxStore,
        *,
        interval: float = FLOOR_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._next = 0.0
        self._pending: _Candidate | None = None
        """Taken, its writers not yet seen gone."""
        self._confirmed: _Candidate | None = None
        """Its writers seen gone: the next step raises the floor to it."""
        self.value = 1
        """No row has a lower id, nor ever will (identity ids start at 1)."""

    @property
    def after(self) -> int:
        """The floor as a read's cursor (`id > after`)."""
        return self.value - 1

    def refresh(self, conn: Connection[TupleRow], *, force: bool = False) -> int:
        """One step if due (or `force`); the floor."""
        now = self._clock()
        if not force and now < self._next:
            return self.value
        if not self._lock.acquire(blocking=False):
            return self.value
        try:
            self._next = now + self._interval
            confirmed, pending = self._confirmed, self._pending
            step = self._store.floor_step(
                conn,
                self.value,
                upto=None if confirmed is None else confirmed.upto,
                since=None if pending is None else pending.since,
            )
            if step is None:
                return self.value
            floor, passed, last, at = step
            self.value = max(self.value, floor)
            self._confirmed = pending if passed else None
            if passed or pending is None:
                self._pending = _Candidate(last, at)
            return self.value
        finally:
            self._lock.release()

    def reset(self) -> None:
        """Back to the head (a connection to another database, say: tests)."""
        with self._lock:
            self.value, self._pending, self._confirmed, self._next = 1, None, None, 0.0
