"""The outbox's one gateway: every statement on the outbox, its quarantine, the discards'
audit trail and the lanes' advisory locks, composed once for the service's `OutboxTables`.

The writers (rows in, the depth they throttle on), the relay (reads, deletes, quarantine
moves, backlog gauges, the frontier, its lane locks), the fan-out's page statement and the
operator commands (`outbox status`, `outbox quarantine ...`) all go through one
`OutboxStore`; the SQL is in `sql/*.sql`, named, and nothing else in the service runs any
of it.

Statements run often on the outbox (reads, deletes, backlog, depth, frontier) are never
prepared: the outbox is empty one moment and holds millions of rows the next, and a generic
plan made while it was empty (a sequential scan and a sort of the whole table) would serve
the next burst (docs/design/identity-fanout.md "Outbox relay").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, LiteralString, NamedTuple

import msgspec
from psycopg import Connection, sql
from psycopg.rows import TupleRow, class_row, kwargs_row

from identity_fanout.outbox.errors import DiscardNeedsForceError, QuarantinedRowNotFoundError
from identity_fanout.outbox.quarantine import (
    DiscardedRow,
    MovedRow,
    Operator,
    QuarantinedRow,
    RequeuedRow,
    quarantined_row,
)
from identity_fanout.outbox.records import OutboxRecord, records_from_rows
from identity_fanout.outbox.rules import SLOTS, LaneLock
from identity_fanout.outbox.tables import OutboxTables
from pin_runtime.logging import log_event
from pin_runtime.postgres import listen, notify
from pin_runtime.sql import Queries, load_queries

if TYPE_CHECKING:  # the relay's types only: the operator commands load no Kafka client
    from identity_fanout.outbox.rules import Refusal
    from identity_fanout.outbox.writer import OutboxMessage

__all__ = [
    "BACKLOG_EXACT_UP_TO",
    "MERGED_UP_TO",
    "Backlog",
    "FrontierStep",
    "OpenWriterRow",
    "OutboxDepth",
    "OutboxStore",
    "ReadRequest",
]

_log = logging.getLogger(__name__)
"""Where the quarantine's audit lines have always been logged (operators filter on it)."""


def _queries(name: str) -> Queries:
    return load_queries("identity_fanout", f"outbox/sql/{name}.sql")


_relay, _lanes, _frontier, _outbox, _quarantine = map(
    _queries, ("relay", "lanes", "frontier", "outbox", "quarantine")
)

BACKLOG_EXACT_UP_TO: Final = 10_000
"""The backlog gauge counts rows exactly up to here, then reports the id span (cheap): ten
times the alert's threshold (> 1000), so the alert's decision is always exact."""
MERGED_UP_TO: Final = 16
"""A read of at most this many slots merges each slot's head (`read_slot_heads`); with more
it walks the primary key (`read_lanes`): the cheaper of the two for the database
(docs/design/identity-fanout.md "Outbox relay")."""
_MERGED_KEPT: Final = 256
"""Merged statements kept at most: one per set of slots read together (a relay's lanes, or
those sharing a cursor), which a rebalance or a takeover changes."""


def _json_text(value: object) -> str:
    # msgspec instead of the json module: one call per outbox row on the fan-out's hot path.
    return msgspec.json.encode(value).decode()


class ReadRequest(NamedTuple):
    """Up to `limit` rows of `slots`, each slot's after its cursor (`afters`) and up to its
    frontier (`uptos`, both in the order of `slots`), within `budget` payload bytes."""

    slots: tuple[int, ...]
    afters: tuple[int, ...]
    uptos: tuple[int, ...]
    limit: int
    budget: int

    def params(self) -> dict[str, object]:
        """The statement's parameters: each slot's bounds in arrays indexed by slot + 1."""
        afters, uptos = [0] * SLOTS, [-1] * SLOTS
        for slot, after, upto in zip(self.slots, self.afters, self.uptos, strict=True):
            afters[slot], uptos[slot] = after, upto
        return {
            "slots": list(self.slots),
            "afters": afters,
            "uptos": uptos,
            "after": min(self.afters),
            "upto": max(self.uptos),
            "limit": self.limit,
            "budget": self.budget,
        }


class OutboxDepth(NamedTuple):
    """How far the relays are behind the writers (`sql/outbox.sql` depth)."""

    rows: int
    """The id span from the oldest waiting row to the newest: an upper bound of the rows."""
    oldest_age_seconds: float


class Backlog(NamedTuple):
    """What the relay's gauges show of the outbox (`sql/relay.sql` backlog)."""

    rows: int
    """Exact up to `BACKLOG_EXACT_UP_TO`, then the id span from the head."""
    oldest_age_seconds: float
    """Age of the head row; 0 when the outbox is empty."""


class FrontierStep(NamedTuple):
    """One look of the outbox frontier (`sql/frontier.sql`, `outbox.frontier`)."""

    last: int
    """The last id handed out."""
    writers: dict[int, frozenset[str]]
    """The transactions holding each slot's writer lock, looked at after `last`."""
    firsts: dict[str, int]
    """The first id of each of those transactions that shows it (migration 0013)."""
    floor: int


class OpenWriterRow(NamedTuple):
    """A transaction holding writer locks of the outbox's slots (`sql/frontier.sql`
    open_writers): the rows of those slots committed after it took them wait for it to end."""

    slots: list[int]
    pid: int | None
    """None for a prepared transaction (it has no session)."""
    gid: str | None
    """A prepared transaction's name, for COMMIT PREPARED / ROLLBACK PREPARED."""
    application_name: str | None
    user_name: str | None
    """The session's login, or a prepared transaction's owner."""
    state: str | None
    """pg_stat_activity's state, `prepared`, or None when this login may not read it."""
    since: datetime | None
    """xact_start (a prepared transaction's prepare time), None when this login may not read
    it (another login's session without pg_read_all_stats)."""
    open_seconds: float | None


class SlotBacklog(NamedTuple):
    slot: int
    rows: int
    oldest_age_seconds: float


class OutboxStore:
    """Every statement on one service's outbox (`tables`); see the module docstring."""

    def __init__(self, tables: OutboxTables) -> None:
        self.tables = tables
        compose = tables.compose
        self._insert = compose(_outbox, "insert_outbox")
        self._depth = compose(_outbox, "depth")
        self._by_topic = compose(_outbox, "status_by_topic")
        self._head = compose(_outbox, "status_head")
        self._slot_backlog = compose(_outbox, "slot_backlog")
        self._walk = compose(_relay, "read_lanes")
        self._merged: dict[tuple[int, ...], LiteralString] = {}
        self._delete = compose(_relay, "delete_published")
        self._backlog = compose(_relay, "backlog")
        self._frontier = compose(_frontier, "step")
        self._open_writers = compose(_frontier, "open_writers")
        self._lane_locks = compose(_lanes, "lane_locks")
        self._move = compose(_quarantine, "move")
        self._quarantine_counts = compose(_quarantine, "count_by_topic")
        listed = sql.SQL(_quarantine.oldest_first)
        self._list = compose(_quarantine, "select_quarantined", filter=listed)
        by_id = sql.SQL(_quarantine.by_id)
        self._get = compose(_quarantine, "select_quarantined", filter=by_id)
        self._requeue = compose(_quarantine, "requeue")
        self._discard = compose(_quarantine, "discard")

    # -- writers ---------------------------------------------------------------------------

    def write(self, conn: Connection[Any], messages: Sequence[OutboxMessage]) -> int:
        """Add `messages` in the caller's transaction (one statement) and wake the relays on
        commit; the number written."""
        if not messages:
            return 0
        params = {
            "topics": [m.topic for m in messages],
            "keys": [m.key for m in messages],
            "payloads": [m.value for m in messages],
            "headers": [_json_text(m.headers) for m in messages],
            "message_ids": [m.message_id for m in messages],
            "event_types": [m.event_type for m in messages],
        }
        conn.execute(self._insert, params)
        self.wake_relays(conn)
        return len(messages)

    def writer_statement(
        self, queries: Queries, name: str, **parts: sql.Composable
    ) -> LiteralString:
        """A writer's own statement that puts rows into the outbox (the fan-out's page),
        composed with the outbox's names: `{outbox}`, and `{key_slot}` for each row's slot."""
        return self.tables.compose(queries, name, **parts)

    def wake_relays(self, conn: Connection[Any]) -> None:
        """NOTIFY the relays when the caller's transaction commits (a writer that put rows
        in by its own statement calls this)."""
        notify(conn, self.tables.channel)

    def depth(self, conn: Connection[TupleRow], floor: int = 1) -> OutboxDepth:
        """How far the relays are behind; the head looked for from `floor` (`outbox.frontier`)."""
        row = conn.execute(self._depth, {"floor": floor}, prepare=False).fetchone()
        return OutboxDepth(0, 0.0) if row is None else OutboxDepth(int(row[0]), float(row[1]))

    # -- the relay -------------------------------------------------------------------------

    def read(
        self,
        conn: Connection[TupleRow],
        request: ReadRequest,
        *,
        statement: LiteralString | None = None,
    ) -> list[OutboxRecord]:
        """The rows `request` asks for, in id order (at least one when any is there), by
        `read_statement` (or `statement`, one of the two a plan test compares)."""
        params = request.params()
        if statement is None:
            statement = self.read_statement(request.slots)
        # Binary: the payload (bytea) arrives as is instead of hex text to decode.
        rows = conn.execute(statement, params, binary=True, prepare=False).fetchall()
        return records_from_rows(rows)

    def read_statement(self, slots: tuple[int, ...]) -> LiteralString:
        """The walk of the primary key, or for few slots the merge of their heads along the
        (key_slot, id) index (composed once per set of slots)."""
        if len(slots) > MERGED_UP_TO:
            return self._walk
        merged = self._merged.get(slots)
        if merged is None:
            if len(self._merged) >= _MERGED_KEPT:  # lanes regrouped often: keep it bounded
                self._merged.clear()
            heads = sql.SQL(" UNION ALL ").join(
                sql.SQL(
                    self.tables.compose(
                        _relay,
                        "slot_head",
                        slot=sql.Literal(slot),
                        index=sql.Literal(slot + 1),
                    )
                )
                for slot in slots
            )
            merged = self._merged[slots] = self.tables.compose(
                _relay, "read_slot_heads", heads=heads
            )
        return merged

    def delete(self, conn: Connection[TupleRow], ids: Sequence[int]) -> int:
        """Delete exactly these (acknowledged) rows; how many were still there."""
        # An array literal built in C: psycopg would dump a list of ints element by element.
        literal = "{" + ",".join(map(str, ids)) + "}"
        return conn.execute(self._delete, {"ids": literal}, prepare=False).rowcount

    @property
    def backlog_statement(self) -> LiteralString:
        """The statement `backlog` runs (its parameters: `exact_up_to`, `floor`), for a
        benchmark's or a test's EXPLAIN of it."""
        return self._backlog

    def backlog(self, conn: Connection[TupleRow], floor: int = 1) -> Backlog:
        """Rows waiting (exact up to `BACKLOG_EXACT_UP_TO`) and the head's age, from `floor`."""
        row = conn.execute(
            self._backlog, {"exact_up_to": BACKLOG_EXACT_UP_TO, "floor": floor}, prepare=False
        ).fetchone()
        if row is None:
            return Backlog(0, 0.0)
        counted, span, _oldest, age = row
        rows = counted if counted < BACKLOG_EXACT_UP_TO else (span or counted)
        return Backlog(int(rows), max(0.0, age) if age is not None else 0.0)

    def frontier_step(
        self, conn: Connection[TupleRow], floor: int, *, upto: int | None
    ) -> FrontierStep | None:
        """One look of the outbox frontier (`outbox.frontier` says what each part proves)."""
        row = conn.execute(
            self._frontier,
            {
                "floor": floor,
                "upto": upto,
                "class": self.tables.writer_lock_class,
                "first_class": self.tables.first_id_lock_class,
            },
            prepare=False,
        ).fetchone()
        if row is None:
            return None
        last, slots, holders, first_ids, new_floor = row
        writers: dict[int, set[str]] = {}
        firsts: dict[str, int] = {}
        for slot, holder, first in zip(slots, holders, first_ids, strict=True):
            writers.setdefault(slot, set()).add(holder)
            if first is not None:
                firsts[holder] = int(first)
        return FrontierStep(
            int(last),
            {slot: frozenset(held) for slot, held in writers.items()},
            firsts,
            int(new_floor),
        )

    def move_to_quarantine(
        self, conn: Connection[TupleRow], refusals: Sequence[Refusal]
    ) -> list[MovedRow]:
        """Move the refused rows into the quarantine: one statement deletes each from the
        outbox and inserts it there (the payload never leaves the server), so a row is in
        one of the two, never lost and never in both."""
        if not refusals:
            return []
        params = {
            "ids": [r.record.id for r in refusals],
            "codes": [r.failure.code for r in refusals],
            "reasons": [r.failure.reason for r in refusals],
            "messages": [r.failure.message for r in refusals],
        }
        with conn.cursor(row_factory=class_row(MovedRow)) as cur:
            return cur.execute(self._move, params, prepare=False).fetchall()

    # -- the lanes' advisory locks ---------------------------------------------------------

    def join_relays(self, conn: Connection[TupleRow]) -> None:
        """Take the shared member lock (this session counts as a relay instance), plan in id
        order (`sql/lanes.sql` says why) and LISTEN to the writers' channel: before the first
        read, so a row committed after it still wakes the relay."""
        conn.execute(_lanes.join_members, {"members": self.tables.member_lock_class})
        conn.execute(_lanes.plan_in_id_order)
        listen(conn, self.tables.channel)

    def lane_locks(self, conn: Connection[TupleRow]) -> list[LaneLock]:
        """Who is a relay instance and who holds which slot (`rules.LaneLock`)."""
        tables = self.tables
        params = {"class": tables.lane_lock_class, "members": tables.member_lock_class}
        with conn.cursor(row_factory=class_row(LaneLock)) as cur:
            return cur.execute(self._lane_locks, params).fetchall()

    def try_lock_slots(self, conn: Connection[TupleRow], slots: Sequence[int]) -> set[int]:
        """The slots whose session lock this session now holds (the others are taken)."""
        params = {"class": self.tables.lane_lock_class, "slots": list(slots)}
        return {s for s, ok in conn.execute(_lanes.try_lock_slots, params).fetchall() if ok}

    def unlock_slots(self, conn: Connection[TupleRow], slots: Sequence[int]) -> None:
        params = {"class": self.tables.lane_lock_class, "slots": list(slots)}
        conn.execute(_lanes.unlock_slots, params)

    def name_session(self, conn: Connection[TupleRow], name: str) -> None:
        """This session's application_name, where `outbox status` reads a relay's pause."""
        conn.execute(_lanes.set_name, {"name": name})

    # -- status ----------------------------------------------------------------------------

    def rows_by_topic(self, conn: Connection[TupleRow]) -> dict[str, int]:
        return dict(conn.execute(self._by_topic).fetchall())

    def head(self, conn: Connection[TupleRow]) -> tuple[datetime, float] | None:
        """created_at of the next row to publish and its age in seconds (None: empty)."""
        row = conn.execute(self._head).fetchone()
        return None if row is None else (row[0], max(0.0, row[1]))

    def backlog_by_slot(self, conn: Connection[TupleRow]) -> list[SlotBacklog]:
        return [SlotBacklog(*row) for row in conn.execute(self._slot_backlog).fetchall()]

    def open_writers(self, conn: Connection[TupleRow]) -> list[OpenWriterRow]:
        """Every transaction holding writer locks now, longest open first (unknown last)."""
        params = {"class": self.tables.writer_lock_class}
        with conn.cursor(row_factory=class_row(OpenWriterRow)) as cur:
            return cur.execute(self._open_writers, params).fetchall()

    # -- the quarantine --------------------------------------------------------------------

    def quarantine_counts(self, conn: Connection[TupleRow]) -> dict[str, int]:
        """Quarantined rows by topic."""
        return dict(conn.execute(self._quarantine_counts).fetchall())

    def quarantined(self, conn: Connection[TupleRow], *, limit: int = 100) -> list[QuarantinedRow]:
        """The quarantine in the order rows were refused (oldest first)."""
        with conn.cursor(row_factory=kwargs_row(quarantined_row)) as cur:
            return cur.execute(self._list, {"limit": limit}).fetchall()

    def quarantined_by_id(self, conn: Connection[TupleRow], row_id: int) -> QuarantinedRow:
        """`QuarantinedRowNotFoundError` if it is not (or no longer) there."""
        with conn.cursor(row_factory=kwargs_row(quarantined_row)) as cur:
            row = cur.execute(self._get, {"id": row_id}).fetchone()
        if row is None:
            raise QuarantinedRowNotFoundError(row_id)
        return row

    def requeue(
        self, conn: Connection[TupleRow], row_id: int | None, *, dry_run: bool = False
    ) -> list[RequeuedRow]:
        """Quarantined row `row_id` (None: every row, in the order they were refused) back to
        the tail of the outbox under new ids, keeping their attempt count and first failure,
        with a NOTIFY for the relays; one transaction. `QuarantinedRowNotFoundError` when
        `row_id` is not there. `dry_run`: the same statement, rolled back (the outbox ids it
        returns are then only what they would have been)."""
        params = {"all": row_id is None, "ids": [] if row_id is None else [row_id]}
        with conn.transaction(force_rollback=dry_run):
            with conn.cursor(row_factory=class_row(RequeuedRow)) as cur:
                rows = cur.execute(self._requeue, params).fetchall()
            if rows and not dry_run:
                self.wake_relays(conn)
        if row_id is not None and not rows:
            raise QuarantinedRowNotFoundError(row_id)
        return rows

    def discard(
        self,
        conn: Connection[TupleRow],
        row_id: int | None,
        *,
        reason: str,
        operator: Operator,
        force: bool = False,
        dry_run: bool = False,
    ) -> list[DiscardedRow]:
        """Delete quarantined row `row_id` (None: every row) for good: one transaction that
        writes an audit row per row (the `discards` table), then one WARNING log line per row
        naming it, its key, who (`operator`, the database login) and the operator's `reason`.

        `DiscardNeedsForceError` without `force` when a guarded row is among them
        (`OutboxTables.needs_force`; nothing is discarded); `QuarantinedRowNotFoundError`
        when `row_id` is not there. `dry_run`: the same statement and checks, rolled back,
        no audit row nor log line: the rows it would discard."""
        params = {
            "all": row_id is None,
            "ids": [] if row_id is None else [row_id],
            "forced": force,
            "reason": reason,
            "os_user": operator.os_user,
            "host": operator.host,
        }
        tables = self.tables
        with (
            conn.transaction(force_rollback=dry_run),
            conn.cursor(row_factory=class_row(DiscardedRow)) as cur,
        ):
            rows = cur.execute(self._discard, params).fetchall()
            guarded = [row for row in rows if tables.needs_force(row.topic, row.event_type)]
            if guarded and not force:  # raised inside the transaction: nothing was deleted
                raise DiscardNeedsForceError([row.quarantine_id for row in guarded], tables.guard)
        if row_id is not None and not rows:
            raise QuarantinedRowNotFoundError(row_id)
        for row in () if dry_run else rows:
            log_event(
                _log,
                "outbox quarantined row discarded",
                logging.WARNING,
                **row.log_fields(tables),
                forced=force,
                osUser=operator.os_user,
                host=operator.host,
                reason=reason,
            )
        return rows
