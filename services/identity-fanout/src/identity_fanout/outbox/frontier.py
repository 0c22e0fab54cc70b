"""The outbox frontier: per slot, the id up to which every row is committed or never will be;
and the floor, an id below which no row is, nor ever will be.

A writer takes a row's id before it commits, so a row may commit below ids already read.
The relays therefore read a slot only up to its frontier (`rules.advance_frontier` decides,
`sql/frontier.sql` looks): each writing transaction shows in pg_locks, from before its
first id in a slot until it ends, as a holder of the slot's writer lock (migration 0012),
and from right after its first id, that id (migration 0013); a slot is settled up to the
last id handed out, or below its holders' first ids, in the step that sees them. Nothing
needs a grant (pg_locks is readable by every login), a prepared transaction that wrote a row
holds its slot until COMMIT PREPARED, and a transaction that writes no outbox row never
holds anything back.

The floor is what every statement that reads the outbox from its head starts at (a relay's
read with no cursor, the backlog gauges, the writers' depth), instead of the primary key's
first entry: rows the relays deleted stay in the index until VACUUM, and while a snapshot
older than the deletes is held, a walk from the first entry fetched each of them from the
heap again (docs/design/identity-fanout.md "The outbox frontier"). It rises to the first row
still there at or below the lowest frontier, or past it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Final

from psycopg import Connection
from psycopg.rows import TupleRow

from identity_fanout.outbox.rules import SLOTS, SlotWait, advance_frontier
from identity_fanout.outbox.store import OutboxStore

__all__ = ["STEP_INTERVAL", "OutboxFrontier"]

STEP_INTERVAL: Final = 0.5
"""Seconds between a worker's steps (the floor its depth check starts at); a relay steps
before every read."""


class OutboxFrontier:
    """One process's frontier and floor of one outbox, moved by `step` (or by `refresh` at
    most every `interval` seconds); thread-safe (a step under way elsewhere is not waited
    for)."""

    def __init__(
        self,
        store: OutboxStore,
        *,
        interval: float = STEP_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._next = 0.0
        self._frontier = [0] * SLOTS
        self._waits: dict[int, SlotWait] = {}
        self._last = 0
        """The last id handed out, as the last step read it."""
        self._holders: Mapping[int, frozenset[str]] = {}
        self._seen: dict[str, float] = {}
        """When a step first saw each writer of the last step (the clock's time)."""
        self.value = 1
        """The floor: no row has a lower id, nor ever will (ids start at 1)."""

    @property
    def after(self) -> int:
        """The floor as a read's cursor (`id > after`)."""
        return self.value - 1

    def upto(self, slot: int) -> int:
        """Every row of `slot` with an id up to this is committed or never will be."""
        return self._frontier[slot]

    def waiting(self, slots: Collection[int]) -> bool:
        """Whether one of `slots` was settled short of the last id at the last step: a
        writer's end, a commit or a rollback, moves it, and a rollback wakes nobody."""
        return any(self._frontier[slot] < self._last for slot in slots)

    def oldest_writer_age(self, slots: Iterable[int]) -> float:
        """How long the oldest writer holding one of `slots` at the last step has held writer
        locks, counted from the first step that saw it (0: none). Short of the truth by at
        most the time between two steps, or by what came before this process's first step;
        it needs no statement of its own and no grant (a transaction's xact_start would
        need pg_read_all_stats for another login's session)."""
        holders, seen, now = self._holders, self._seen, self._clock()
        # .get: a step under way in another thread may have replaced one of the two.
        first = min((seen.get(w, now) for s in slots for w in holders.get(s, ())), default=now)
        return max(0.0, now - first)

    def step(self, conn: Connection[TupleRow]) -> int:
        """One step now (`sql/frontier.sql`); the floor."""
        return self.refresh(conn, force=True)

    def refresh(self, conn: Connection[TupleRow], *, force: bool = False) -> int:
        """One step if due (or `force`); the floor."""
        now = self._clock()
        if not force and now < self._next:
            return self.value
        if not self._lock.acquire(blocking=False):
            return self.value
        try:
            self._next = now + self._interval
            # The floor rises to what the last step confirmed: this statement's snapshot sees
            # every row up to it that was committed.
            upto = min(self._frontier)
            step = self._store.frontier_step(conn, self.value, upto=upto or None)
            if step is None:
                return self.value
            self.value = max(self.value, step.floor)
            self._frontier, self._waits = advance_frontier(
                self._frontier, self._waits, step.last, step.writers, step.firsts
            )
            self._last = step.last
            seen, writers = self._seen, frozenset[str]().union(*step.writers.values())
            self._seen = {w: seen.get(w, now) for w in writers}
            self._holders = step.writers
            return self.value
        finally:
            self._lock.release()

    def reset(self) -> None:
        """Back to the head (a connection to another database, say: tests)."""
        with self._lock:
            self.value, self._frontier, self._waits, self._next = 1, [0] * SLOTS, {}, 0.0
            self._last = 0
            self._holders, self._seen = {}, {}
