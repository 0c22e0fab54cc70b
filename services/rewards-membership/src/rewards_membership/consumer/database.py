"""The consumer's database side: the one thread every statement runs on, and the one
transaction that applies a batch.

Every statement of the consumer runs on the database thread (`DatabaseThread`), in order.
The poll loop hands a validated batch to it and goes on polling and decoding the next one
while PostgreSQL applies this one (psycopg waits on the socket without holding the GIL).
Everything else the loop asks of the database (dead-letter marks, the recovery probe, the
unreplayed gauge, dropping a broken connection) goes through the same thread and waits for
it, so the one connection is never used by two threads and a later statement never
overtakes the batch before it.

On that thread a batch is applied (`BatchApplier`): read (inbox keys, rows, unlocked),
decided in memory (`plan_batch`) and written in ONE transaction; a row another writer
changed meanwhile (the update's compare-and-set on its version) or a row or key another
instance inserted meanwhile makes it re-read and re-decide at once, a few times, before it
counts as an outage. Every statement runs under the session limits of
`settings.database_session()`, so a lock held elsewhere fails the batch within the lock
timeout instead of stalling the loop.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final, TypeVar

import psycopg
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from pin_runtime.logging import log_event
from rewards_membership.errors import ConcurrentApplyError
from rewards_membership.rules.plan import BatchPlan, inbox_keys, plan_batch, row_keys
from rewards_membership.rules.validation import InvalidEvent, MembershipChange
from rewards_membership.store import MembershipStore

__all__ = ["BatchApplier", "DatabaseThread"]

_log = logging.getLogger("rewards_membership.consumer.loop")
_CONCURRENT_RETRIES: Final = 5

T = TypeVar("T")


class DatabaseThread:
    def __init__(self, applier: BatchApplier) -> None:
        self._applier = applier
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="membership-db")

    def submit(self, items: Sequence[MembershipChange | InvalidEvent]) -> Future[BatchPlan]:
        """Apply the batch in its own transaction on the database thread; the caller's trace context
        (its current span) becomes the parent of the `pg apply batch` span."""
        context = contextvars.copy_context()
        return self._executor.submit(context.run, self._applier.apply, items)

    def run(self, call: Callable[[BatchApplier], T]) -> T:
        """Run `call` on the thread after whatever was submitted before, and wait for it."""
        context = contextvars.copy_context()
        return self._executor.submit(context.run, call, self._applier).result()

    def mark_dead_lettered(self, keys: Sequence[str]) -> None:
        if keys:
            self.run(lambda applier: applier.mark_dead_lettered(keys))

    def probe(self) -> psycopg.Error | None:
        return self.run(BatchApplier.probe)

    def count_unreplayed(self) -> int | None:
        return self.run(BatchApplier.count_unreplayed)

    def discard(self) -> None:
        self.run(BatchApplier.discard)

    def close(self) -> None:
        """Wait for what was submitted, close the connection, stop the thread."""
        try:
            self.run(BatchApplier.close)
        finally:
            self._executor.shutdown(wait=True)


class BatchApplier:
    def __init__(self, store: MembershipStore, tracer: trace.Tracer) -> None:
        self._store = store
        self._tracer = tracer

    def apply(self, items: Sequence[MembershipChange | InvalidEvent]) -> BatchPlan:
        for attempt in range(1, _CONCURRENT_RETRIES + 1):
            try:
                return self._apply(items)
            except ConcurrentApplyError:
                # The store dropped its transaction; re-read the rows and the inbox.
                if attempt == _CONCURRENT_RETRIES:
                    raise
                log_event(_log, "concurrent apply, re-deciding batch", attempt=attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _apply(self, items: Sequence[MembershipChange | InvalidEvent]) -> BatchPlan:
        keys = inbox_keys(items)
        if not keys:
            return plan_batch(items, set(), {})
        with self._tracer.start_as_current_span(
            "pg apply batch",
            kind=SpanKind.CLIENT,
            attributes={
                "db.system.name": "postgresql",
                "db.system": "postgresql",
                "db.namespace": "rewards",
                "db.operation.name": "apply membership batch",
                "db.operation.batch.size": len(keys),
            },
        ):
            conn = self._store.connection()
            with conn.transaction():
                seen, rows = self._store.read(conn, keys, row_keys(items))
                plan = plan_batch(items, seen, rows)
                self._store.write(conn, plan)
        return plan

    def mark_dead_lettered(self, keys: Sequence[str]) -> None:
        """Inbox marks of dead letters the broker acknowledged (one statement)."""
        if keys:
            self._store.mark_dead_lettered(self._store.connection(), keys)

    def probe(self) -> psycopg.Error | None:
        """`SELECT 1`; the error when the database is still unreachable."""
        try:
            self._store.probe(self._store.connection())
        except psycopg.Error as exc:
            self._store.discard()
            return exc
        return None

    def count_unreplayed(self) -> int | None:
        """Dead letters not yet replayed, or None while the database cannot say."""
        try:
            return self._store.count_unreplayed(self._store.connection())
        except psycopg.Error:
            self._store.discard()
            return None

    def discard(self) -> None:
        self._store.discard()

    def close(self) -> None:
        self._store.close()
