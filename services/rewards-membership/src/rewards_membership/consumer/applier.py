"""The database side of a batch: one transaction deciding and writing it, dead-letter marks.

A batch is read (inbox keys, rows, unlocked), decided in memory (`plan_batch`) and written
in ONE transaction; a row another writer changed meanwhile (the update's compare-and-set on
its version) or a row or key another instance inserted meanwhile makes it re-read and
re-decide at once, a few times, before it counts as an outage. Every statement runs under
the session limits of `settings.database_session()`, so a lock held elsewhere fails the
batch within the lock timeout instead of stalling the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

import psycopg
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from pin_runtime.logging import log_event
from rewards_membership.errors import ConcurrentApplyError
from rewards_membership.rules.plan import BatchPlan, inbox_keys, plan_batch, row_keys
from rewards_membership.rules.validation import InvalidEvent, MembershipChange
from rewards_membership.store import MembershipStore

__all__ = ["BatchApplier"]

_log = logging.getLogger("rewards_membership.consumer.loop")
_CONCURRENT_RETRIES: Final = 5


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
