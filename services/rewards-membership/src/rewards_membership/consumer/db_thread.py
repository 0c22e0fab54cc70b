"""The consumer's one database thread: every statement of the consumer runs on it, in order.

The poll loop hands a validated batch to the database thread and goes on polling and decoding the
next one while PostgreSQL applies this one (psycopg waits on the socket without holding
the GIL). Everything else the loop asks of the database (dead-letter marks, the recovery
probe, the unreplayed gauge, dropping a broken connection) goes through the same thread and
waits for it, so the one connection is never used by two threads and a later statement
never overtakes the batch before it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import psycopg

from rewards_membership.consumer.applier import BatchApplier
from rewards_membership.rules.plan import BatchPlan
from rewards_membership.rules.validation import InvalidEvent, MembershipChange

__all__ = ["DatabaseThread"]

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
