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
The parts that go through commit; those that meet the lock again are `Applied.contended`,
rolled back, and only their partitions are paused. A partition resumed after such a pause
(a suspect) has its records tried the same way, apart from the others', until one of its
batches succeeds: a lock still held costs the others no second lock timeout.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final, NamedTuple, TypeVar

import psycopg
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from psycopg.errors import LockNotAvailable

from pin_runtime.logging import log_event
from rewards_membership.batch_sql import records_document
from rewards_membership.consumer.spans import STORAGE_ATTRIBUTES, STORAGE_SPAN
from rewards_membership.errors import CommitInDoubtError, ConcurrentApplyError, is_infrastructure
from rewards_membership.rules.plan import Outcome, inbox_keys, plan_batch
from rewards_membership.rules.validation import InvalidEvent, MembershipChange
from rewards_membership.store import MembershipStore

__all__ = ["Applied", "BatchApplier", "DatabaseThread"]

_log = logging.getLogger(__name__)
_CONCURRENT_RETRIES: Final = 5
_SWITCH_INTERVAL_S: Final = 0.0005
"""The interpreter's GIL switch interval while a database thread runs (default 5 ms)."""
CONTENDED_LOCK_TIMEOUT_MS: Final = 200
"""The lock timeout of a part applied for one partition after a lock timeout (or of a
suspect partition): long enough for a writer's ordinary transaction to end, short against
a lock held for a whole lock timeout already."""

T = TypeVar("T")


class Applied(NamedTuple):
    """A batch's outcomes, in order, once its transaction committed, and when its statement
    ran (`time.time_ns()`; None when the batch needed no statement): the events' spans.

    `contended`: partitions whose part met a row lock held elsewhere (the error), rolled
    back; `outcomes` are then those of the other partitions' records only, in order."""

    outcomes: list[Outcome]
    stored: tuple[int, int] | None
    contended: Mapping[int, LockNotAvailable] | None = None


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

    def submit(
        self,
        items: Sequence[MembershipChange | InvalidEvent],
        document: str | None = None,
        *,
        partitions: Callable[[], Sequence[int]] | None = None,
        suspects: frozenset[int] = frozenset(),
    ) -> Future[Applied]:
        """Apply the batch in its own transaction on the database thread; the caller's trace context
        (its current span) becomes the parent of the statement's span (`STORAGE_SPAN`).

        `document` is the batch's `records_document(items)`, encoded by the caller (the poll
        loop encodes it while the batch before is in its transaction); without it, it is
        encoded here, on the caller's thread. Either way the database thread only waits on
        PostgreSQL: Python work there would wait for the GIL behind the poll loop's.

        `partitions`: each item's partition, asked only when the batch is split (a lock
        timeout, or `suspects` among its partitions)."""
        if document is None:
            document = records_document(items)
        context = contextvars.copy_context()
        return self._executor.submit(
            context.run,
            functools.partial(
                self._applier.apply_timed, items, document, partitions=partitions, suspects=suspects
            ),
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
        self, items: Sequence[MembershipChange | InvalidEvent], document: str | None = None
    ) -> list[Outcome]:
        """Every record's outcome, in order, once the batch's transaction committed;
        `document` is `records_document(items)` when the caller encoded it already."""
        return self.apply_timed(items, document).outcomes

    def apply_timed(
        self,
        items: Sequence[MembershipChange | InvalidEvent],
        document: str | None = None,
        *,
        partitions: Callable[[], Sequence[int]] | None = None,
        suspects: frozenset[int] = frozenset(),
    ) -> Applied:
        """`apply`, with when its statement ran (the events' storage spans); split per
        partition on a lock timeout, and for `suspects` (module docstring)."""
        if partitions is not None and suspects:
            places = partitions()
            if suspects.intersection(places):
                # The others together at the session's lock timeout, each suspect alone.
                rest = frozenset(places) - suspects
                groups = [(rest, False)] if rest else []
                groups += [(frozenset({p}), True) for p in sorted(suspects.intersection(places))]
                return self._apply_parts(items, places, groups)
        if document is None:
            document = records_document(items)
        try:
            return self._apply_retrying(items, document)
        except LockNotAvailable as exc:
            if partitions is None:
                raise
            places = partitions()
            if len(set(places)) == 1:
                return Applied([], None, {places[0]: exc})
            log_event(
                _log,
                "lock timeout, batch split per partition",
                logging.WARNING,
                partitions=sorted(set(places)),
                reason=str(exc).strip()[:300],
            )
            return self._apply_parts(
                items, places, [(frozenset({p}), True) for p in sorted(set(places))]
            )

    def _apply_parts(
        self,
        items: Sequence[MembershipChange | InvalidEvent],
        places: Sequence[int],
        groups: list[tuple[frozenset[int], bool]],
    ) -> Applied:
        """The batch as parts, each group of partitions in its own transaction, in order
        (`True`: at `CONTENDED_LOCK_TIMEOUT_MS`). A group of several partitions that meets
        a lock timeout is split again, one partition a part."""
        decided: dict[int, Outcome] = {}
        contended: dict[int, LockNotAvailable] = {}
        started: int | None = None
        ended: int | None = None
        while groups:
            group, short = groups.pop(0)
            at = [i for i, p in enumerate(places) if p in group]
            part = [items[i] for i in at]
            try:
                applied = self._apply_retrying(
                    part,
                    records_document(part),
                    lock_timeout_ms=CONTENDED_LOCK_TIMEOUT_MS if short else None,
                )
            except LockNotAvailable as exc:
                if len(group) > 1:
                    groups[:0] = [(frozenset({p}), True) for p in sorted(group)]
                else:
                    contended[next(iter(group))] = exc
                continue
            except Exception as exc:
                if not decided or not is_infrastructure(exc):
                    raise
                # Parts before this one committed: their records are reported as decided
                # on the retry (`CommitInDoubtError`: a duplicate is never remembered).
                outcomes = [Outcome.DUPLICATE] * len(items)
                for i, outcome in decided.items():
                    outcomes[i] = outcome
                if isinstance(exc, CommitInDoubtError):
                    for i, outcome in zip(at, exc.outcomes, strict=True):
                        outcomes[i] = outcome
                raise CommitInDoubtError(outcomes, exc) from exc
            for i, outcome in zip(at, applied.outcomes, strict=True):
                decided[i] = outcome
            if applied.stored is not None:
                started = applied.stored[0] if started is None else started
                ended = applied.stored[1]
        outcomes = [decided[i] for i, p in enumerate(places) if p not in contended]
        stored = (started, ended) if started is not None and ended is not None else None
        return Applied(outcomes, stored, contended)

    def _apply_retrying(
        self,
        items: Sequence[MembershipChange | InvalidEvent],
        document: str,
        *,
        lock_timeout_ms: int | None = None,
    ) -> Applied:
        for attempt in range(1, _CONCURRENT_RETRIES + 1):
            try:
                return self._apply(items, document, lock_timeout_ms)
            except ConcurrentApplyError:
                # Rolled back; decided again on the rows and the inbox as they are now.
                if attempt == _CONCURRENT_RETRIES:
                    raise
                log_event(_log, "concurrent apply, re-deciding batch", attempt=attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _apply(
        self,
        items: Sequence[MembershipChange | InvalidEvent],
        document: str,
        lock_timeout_ms: int | None = None,
    ) -> Applied:
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
                        decided = self._store.apply(conn, document, lock_timeout_ms)
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
