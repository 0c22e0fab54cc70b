"""Reading a lane group's next rows, with the following read already under way.

The next read runs on the lanes' own connection (psycopg serializes its use) in a thread of
its own while the rows before it are produced: the database's latency and the producing
overlap, and a lost connection still shows at the next read (its error surfaces there).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import psycopg
from psycopg.rows import TupleRow

from identity_fanout.outbox.records import OutboxRecord, records_from_rows
from pin_runtime.sql import load_queries

__all__ = ["ReadRequest", "Reader"]

_q = load_queries("identity_fanout", "outbox/sql/relay.sql")


class ReadRequest(NamedTuple):
    """Up to `limit` rows of `slots` after `after`, within `budget` payload bytes."""

    slots: tuple[int, ...]
    after: int
    limit: int
    budget: int

    def same_rows(self, other: ReadRequest) -> bool:
        """Whether `other` reads from the same place (its limit and budget may differ)."""
        return (self.slots, self.after) == (other.slots, other.after)


class Reader:
    """`read(...)` the rows after a cursor; `ahead(...)` starts the following read."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._ahead: tuple[ReadRequest, Future[list[OutboxRecord]]] | None = None

    def read(self, conn: psycopg.Connection[TupleRow], request: ReadRequest) -> list[OutboxRecord]:
        """The rows `request` asks for: those read ahead if they are what is asked (same
        slots, same cursor), else read now."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            asked, future = ahead
            records = future.result()
            if asked.same_rows(request) and records:
                return records[: request.limit]
        return fetch(conn, request)

    def ahead(self, conn: psycopg.Connection[TupleRow], request: ReadRequest) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="outbox-reader")
        self._ahead = (request, self._executor.submit(fetch, conn, request))

    def forget(self) -> None:
        """Drop what was read ahead (a reset cursor, lost lanes)."""
        self._ahead = None

    def close(self) -> None:
        self._ahead = None
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


def fetch(conn: psycopg.Connection[TupleRow], request: ReadRequest) -> list[OutboxRecord]:
    params = request._asdict() | {"slots": list(request.slots)}
    # Binary: the payload (bytea) arrives as is instead of hex text to decode.
    # Never prepared, so PostgreSQL plans every read for its own parameters and the outbox
    # as it is now. Prepared (psycopg does it after `prepare_threshold` runs), the read is
    # soon served by a generic plan, and an idle relay makes that plan while the outbox is
    # empty: a sequential scan and a sort of the whole outbox, kept for the next burst
    # (every read of 5,000 rows of 200,000 then sorted all of them). Planning costs ~0.3 ms
    # per read of up to RELAY_BATCH_SIZE rows (docs/design/identity-fanout.md "Outbox relay",
    # "Plans of the read").
    rows = conn.execute(_q.read_lanes, params, binary=True, prepare=False).fetchall()
    return records_from_rows(rows)
