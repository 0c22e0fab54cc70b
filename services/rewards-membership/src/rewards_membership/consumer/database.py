"""The consumer's database side: the one thread every statement runs on, and the one
transaction that applies a batch.

Every statement of the consumer runs on the database thread (`DatabaseThread`), in order.
The poll loop hands a validated batch to it and goes on polling and decoding the next one
while PostgreSQL applies this one (psycopg waits on the socket without holding the GIL).
Everything else the loop asks of the database (dead-letter marks, the recovery probe, the
unreplayed gauge, dropping a broken connection) goes through the same thread and waits for
it, so the one connection is never used by two threads and a later statement never
overtakes the batch before it.

On that thread a batch is applied (`BatchApplier`): ONE statement in ONE transaction reads
the inbox keys and rows (unlocked), decides every record as `plan_batch` does and writes
the rows and marks (`store.MembershipStore.apply`); a row another writer changed meanwhile
(the update's compare-and-set on its version) or a row or key another instance inserted
meanwhile makes it roll back and decide again at once on fresh rows, a few times, before
it counts as an outage. Every statement runs under the session limits of
`settings.database_session()`, so a lock held elsewhere fails the batch within the lock
timeout instead of stalling the loop.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final, NamedTuple, TypeVar

import psycopg
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from pin_runtime.logging import log_event
from rewards_membership.batch_sql import records_document
from rewards_membership.consumer.spans import STORAGE_ATTRIBUTES, STORAGE_SPAN
from rewards_membership.errors import CommitInDoubtError, ConcurrentApplyError
from rewards_membership.rules.plan import Outcome, inbox_keys, plan_batch
from rewards_membership.rules.validation import InvalidEvent, MembershipChange
from rewards_membership.store import MembershipStore

__all__ = ["Applied", "BatchApplier", "DatabaseThread"]

_log = logging.getLogger("rewards_membership.consumer.loop")
_CONCURRENT_RETRIES: Final = 5
_SWITCH_INTERVAL_S: Final = 0.0005
"""The interpreter's GIL switch interval while a database thread runs (default 5 ms)."""

T = TypeVar("T")


class Applied(NamedTuple):
    """A batch's outcomes, in order, once its transaction committed, and when its statement
    ran (`time.time_ns()`; None when the batch needed no statement): the events' spans."""

    outcomes: list[Outcome]
    stored: tuple[int, int] | None


class DatabaseThread:
    def __init__(self, applier: BatchApplier) -> None:
        # Each time PostgreSQL answers, this thread needs the GIL back from the poll loop,
        # which holds it for CPU-bound decoding: by default for up to 5 ms a hand-off, a
        # few hand-offs a batch, all on the batch's path to its commit (1.2-1.7 s of a
        # 300,000-event drain, docs/design "Overlap"). Hand-offs only happen when a thread
        # waits for the GIL, so a shorter interval costs the loop nothing otherwise.
        # Process-wide: lowered, never raised.
        sys.setswitchinterval(min(sys.getswitchinterval(), _SWITCH_INTERVAL_S))
        self._applier = applier
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="membership-db")

    def submit(
        self, items: Sequence[MembershipChange | InvalidEvent], document: str | None = None
    ) -> Future[Applied]:
        """Apply the batch in its own transaction on the database thread; the caller's trace context
        (its current span) becomes the parent of the statement's span (`STORAGE_SPAN`).

        `document` is the batch's `records_document(items)`, encoded by the caller (the poll
        loop encodes it while the batch before is in its transaction); without it, it is
        encoded here, on the caller's thread. Either way the database thread only waits on
        PostgreSQL: Python work there would wait for the GIL behind the poll loop's."""
        if document is None:
            document = records_document(items)
        context = contextvars.copy_context()
        return self._executor.submit(context.run, self._applier.apply_timed, items, document)

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

    def apply(
        self, items: Sequence[MembershipChange | InvalidEvent], document: str | None = None
    ) -> list[Outcome]:
        """Every record's outcome, in order, once the batch's transaction committed;
        `document` is `records_document(items)` when the caller encoded it already."""
        return self.apply_timed(items, document).outcomes

    def apply_timed(
        self, items: Sequence[MembershipChange | InvalidEvent], document: str | None = None
    ) -> Applied:
        """`apply`, with when its statement ran (the events' storage spans)."""
        if document is None:
            document = records_document(items)
        for attempt in range(1, _CONCURRENT_RETRIES + 1):
            try:
                return self._apply(items, document)
            except ConcurrentApplyError:
                # Rolled back; decided again on the rows and the inbox as they are now.
                if attempt == _CONCURRENT_RETRIES:
                    raise
                log_event(_log, "concurrent apply, re-deciding batch", attempt=attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _apply(self, items: Sequence[MembershipChange | InvalidEvent], document: str) -> Applied:
        keys = inbox_keys(items)
        if not keys:
            # Only dead letters without a key: nothing to look up or write.
            return Applied(plan_batch(items, set(), {}).outcomes, None)
        started = time.time_ns()
        with self._tracer.start_as_current_span(
            STORAGE_SPAN,
            kind=SpanKind.CLIENT,
            attributes=STORAGE_ATTRIBUTES | {"db.operation.batch.size": len(keys)},
        ):
            conn = self._store.connection()
            if not any(type(item) is MembershipChange for item in items):
                # Only dead letters: their inbox lookup alone (no write, no write lock),
                # decided by the pure plan.
                outcomes = plan_batch(items, self._store.seen_keys(conn, keys), {}).outcomes
            else:
                decided: list[Outcome] | None = None
                try:
                    # Pipelined: BEGIN goes with the statement, one round trip, then COMMIT.
                    with conn.pipeline(), conn.transaction():
                        decided = self._store.apply(conn, document)
                except psycopg.OperationalError as exc:
                    if decided is None:
                        raise
                    # The statement answered and the connection went before COMMIT did:
                    # committed or not, nobody can say. The retry tells: a record it finds
                    # in the inbox is one this try committed, and is reported as decided.
                    raise CommitInDoubtError(decided, exc) from exc
                outcomes = decided
        return Applied(outcomes, (started, time.time_ns()))

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
