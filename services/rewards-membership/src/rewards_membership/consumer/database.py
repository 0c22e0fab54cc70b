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

A lock timeout (SQLSTATE 55P03: a row of the batch locked elsewhere) concerns the
partition(s) whose records touch that row, not the batch: the batch is applied again at
once split per partition, each partition's part in its own transaction at a short lock
timeout (`CONTENDED_LOCK_TIMEOUT_MS`: the lock has been held a whole lock timeout already).
The parts that go through commit; those that meet the lock again are `Batch.contended`,
rolled back, and only their partitions are paused. A partition resumed after such a pause
(a suspect) has its records tried the same way, apart from the others', until one of its
batches succeeds: a lock still held costs the others no second lock timeout.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Final, TypeVar

import psycopg
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from psycopg.errors import LockNotAvailable

from pin_runtime.logging import log_event
from rewards_membership.consumer.spans import STORAGE_ATTRIBUTES, STORAGE_SPAN
from rewards_membership.errors import CommitInDoubtError, ConcurrentApplyError
from rewards_membership.records import Record
from rewards_membership.rules.plan import Outcome, inbox_keys, plan_batch
from rewards_membership.rules.validation import MembershipChange
from rewards_membership.store import MembershipStore

if TYPE_CHECKING:
    from rewards_membership.consumer.batch import Batch

__all__ = ["BatchApplier", "DatabaseThread"]

_log = logging.getLogger(__name__)
_CONCURRENT_RETRIES: Final = 5
_SWITCH_INTERVAL_S: Final = 0.0005
"""The interpreter's GIL switch interval while a database thread runs (default 5 ms)."""
CONTENDED_LOCK_TIMEOUT_MS: Final = 200
"""The lock timeout of a part applied for one partition after a lock timeout (or of a
suspect partition): long enough for a writer's ordinary transaction to end, short against
a lock held for a whole lock timeout already."""

T = TypeVar("T")
Stored = tuple[int, int] | None
"""When a statement ran (`time.time_ns()`), None when the records needed none."""


class DatabaseThread:
    def __init__(self, applier: BatchApplier) -> None:
        # Each time PostgreSQL answers, this thread needs the GIL back from the poll loop,
        # which holds it for CPU-bound decoding: by default for up to 5 ms a hand-off, a
        # few hand-offs a batch, all on the batch's path to its commit
        # (docs/design/rewards-membership.md "Overlap"). Hand-offs only happen when a thread
        # waits for the GIL, so a shorter interval costs the loop nothing otherwise.
        # Process-wide: lowered, never raised.
        sys.setswitchinterval(min(sys.getswitchinterval(), _SWITCH_INTERVAL_S))
        self._applier = applier
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="membership-db")

    def submit(self, batch: Batch, suspects: frozenset[int] = frozenset()) -> Future[None]:
        """Apply the batch in its own transaction on the database thread (`BatchApplier`);
        the caller's trace context (its current span) becomes the parent of the statement's
        span (`STORAGE_SPAN`). Its records and document (its parts' joined) are gathered
        here, on the caller's thread: the database thread only waits on PostgreSQL (Python
        work there would wait for the GIL behind the poll loop's)."""
        context = contextvars.copy_context()
        apply = self._applier.apply
        return self._executor.submit(
            context.run, apply, batch, batch.records(), batch.document(), suspects
        )

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
        self,
        batch: Batch,
        records: Sequence[Record],
        document: bytes,
        suspects: frozenset[int] = frozenset(),
    ) -> None:
        """Apply the batch (its `records` and `document`): each record's outcome once its
        transaction committed, when its statement ran (`batch.stored`) and the partitions
        that met a row lock held elsewhere (`batch.contended`); split per partition on a
        lock timeout, and for `suspects` (module docstring)."""
        partitions = list(batch.parts)
        if suspects.intersection(partitions):
            # The others together at the session's lock timeout, each suspect alone.
            rest = [p for p in partitions if p not in suspects]
            groups = [(rest, False)] if rest else []
            groups += [([p], True) for p in sorted(suspects.intersection(partitions))]
            self._apply_parts(batch, groups)
            return
        try:
            batch.stored = self._apply_retrying(records, document)
        except LockNotAvailable as exc:
            if len(partitions) == 1:
                batch.contended[partitions[0]] = exc
                return
            log_event(
                _log,
                "lock timeout, batch split per partition",
                logging.WARNING,
                partitions=sorted(partitions),
                reason=str(exc).strip()[:300],
            )
            self._apply_parts(batch, [([p], True) for p in sorted(partitions)])

    def _apply_parts(self, batch: Batch, groups: list[tuple[list[int], bool]]) -> None:
        """The batch as parts, each group of partitions in its own transaction, in order
        (`True`: at `CONTENDED_LOCK_TIMEOUT_MS`). A group of several partitions that meets
        a lock timeout is split again, one partition a part. Should a part fail after
        others committed, their records keep their outcomes: the retry reports them as
        decided here."""
        while groups:
            group, short = groups.pop(0)
            try:
                stored = self._apply_retrying(
                    batch.records(group),
                    batch.document(group),
                    lock_timeout_ms=CONTENDED_LOCK_TIMEOUT_MS if short else None,
                )
            except LockNotAvailable as exc:
                if len(group) > 1:
                    groups[:0] = [([p], True) for p in sorted(group)]
                else:
                    batch.contended[group[0]] = exc
                continue
            if stored is not None:
                batch.stored = stored if batch.stored is None else (batch.stored[0], stored[1])

    def _apply_retrying(
        self, records: Sequence[Record], document: bytes, *, lock_timeout_ms: int | None = None
    ) -> Stored:
        for attempt in range(1, _CONCURRENT_RETRIES + 1):
            try:
                return self._apply(records, document, lock_timeout_ms)
            except ConcurrentApplyError:
                # Rolled back; decided again on the rows and the inbox as they are now.
                if attempt == _CONCURRENT_RETRIES:
                    raise
                log_event(_log, "concurrent apply, re-deciding batch", attempt=attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _apply(
        self, records: Sequence[Record], document: bytes, lock_timeout_ms: int | None = None
    ) -> Stored:
        """One transaction: the records' outcomes, set once it committed (or once it is in
        doubt: `CommitInDoubtError`)."""
        keys = inbox_keys(r.item for r in records)
        if not keys:
            # Only dead letters without a key: nothing to look up or write.
            _decided(records, plan_batch([r.item for r in records], set(), {}).outcomes)
            return None
        started = time.time_ns()
        with self._tracer.start_as_current_span(
            STORAGE_SPAN,
            kind=SpanKind.CLIENT,
            attributes=STORAGE_ATTRIBUTES | {"db.operation.batch.size": len(keys)},
        ):
            conn = self._store.connection()
            if not any(type(r.item) is MembershipChange for r in records):
                # Only dead letters: their inbox lookup alone (no write, no write lock),
                # decided by the pure plan.
                seen = self._store.seen_keys(conn, keys)
                outcomes = plan_batch([r.item for r in records], seen, {}).outcomes
            else:
                decided: list[Outcome] | None = None
                try:
                    # Pipelined: BEGIN goes with the statement, one round trip, then COMMIT.
                    with conn.pipeline(), conn.transaction():
                        decided = self._store.apply(conn, document, lock_timeout_ms)
                except psycopg.OperationalError as exc:
                    if decided is None:
                        raise
                    # The statement answered and the connection went before COMMIT did:
                    # committed or not, nobody can say. The retry tells: a record it finds
                    # in the inbox is one this try committed, and is reported as decided.
                    _decided(records, decided)
                    raise CommitInDoubtError(exc) from exc
                outcomes = decided
        _decided(records, outcomes)
        return (started, time.time_ns())

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


def _decided(records: Sequence[Record], outcomes: Sequence[Outcome]) -> None:
    if len(outcomes) != len(records):
        raise ValueError(f"{len(outcomes)} outcome(s) for {len(records)} record(s)")
    for record, outcome in zip(records, outcomes, strict=True):
        record.outcome = outcome
