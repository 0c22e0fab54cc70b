"""Reading a lane group's next rows, with the following read already under way.

The next read runs on the lanes' own connection (psycopg serializes its use) in a thread of
its own while the rows before it are produced: the database's latency and the producing
overlap, and a lost connection still shows at the next read (its error surfaces there).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
from psycopg.rows import TupleRow

from identity_fanout.relay_records import OutboxRecord, records_from_rows
from pin_runtime.sql import load_queries

__all__ = ["Reader"]

_q = load_queries("identity_fanout", "sql/relay.sql")

_Key = tuple[tuple[int, ...], int]


class Reader:
    """`read(...)` the rows after a cursor; `ahead(...)` starts the following read."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._ahead: tuple[_Key, Future[list[OutboxRecord]]] | None = None

    def read(
        self,
        conn: psycopg.Connection[TupleRow],
        slots: list[int],
        after: int,
        limit: int,
        budget: int,
    ) -> list[OutboxRecord]:
        """Up to `limit` rows of `slots` after `after` (within `budget` payload bytes):
        those read ahead if they are what is asked (same slots, same cursor), else now."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            key, future = ahead
            records = future.result()
            if key == (tuple(slots), after) and records:
                return records[:limit]
        return fetch(conn, slots, after, limit, budget)

    def ahead(
        self,
        conn: psycopg.Connection[TupleRow],
        slots: list[int],
        after: int,
        limit: int,
        budget: int,
    ) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="outbox-reader")
        future = self._executor.submit(fetch, conn, slots, after, limit, budget)
        self._ahead = ((tuple(slots), after), future)

    def forget(self) -> None:
        """Drop what was read ahead (a reset cursor, lost lanes)."""
        self._ahead = None

    def close(self) -> None:
        self._ahead = None
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


def fetch(
    conn: psycopg.Connection[TupleRow], slots: list[int], after: int, limit: int, budget: int
) -> list[OutboxRecord]:
    params = {"slots": slots, "after": after, "limit": limit, "budget": budget}
    # Binary: the payload (bytea) arrives as is instead of hex text to decode.
    rows = conn.execute(_q.read_lanes, params, binary=True).fetchall()
    return records_from_rows(rows)
