"""The rewards schema's reads and writes, and the one connection the consumer applies batches on.

The statements live in `sql/*.sql` (one file per aggregate, and `sql/batch.sql` for the batch
statement), loaded once at import.

A batch is ONE set-based statement whatever its size (`batch_sql.py`): it looks the batch's
keys up in the inbox, reads the rows it touches, decides every record (the guard and the
transitions, as `rules.plan.plan_batch` does), writes the rows and the inbox marks and
returns every record's outcome. The rows are not locked: the update is a compare-and-set
on each row's version, and a row another writer changed meanwhile fails the batch, which
is decided again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Final, NamedTuple
from uuid import UUID

import psycopg
from psycopg.rows import TupleRow, class_row
from psycopg.types.json import Json

from pin_runtime.postgres import LazyConnection, OnRefused, SessionLimits, connect
from pin_runtime.sql import columns, load_queries
from rewards_membership.batch_sql import APPLY_BATCH, decode_outcomes
from rewards_membership.errors import ConcurrentApplyError
from rewards_membership.rules.plan import Outcome

__all__ = [
    "AgentRow",
    "MembershipStore",
    "Resolution",
    "clear_dead_letter_marks",
    "fetch_agent_rows",
    "fetch_dead_letter_marks",
    "fetch_replays",
    "fetch_resolutions",
    "prune_inbox",
    "record_replays",
    "record_resolutions",
    "resolve_dead_letter_marks",
]

# The tooling's statements pass binary array parameters (%(x)b): text-dumping an array
# quotes every element through a regex. The batch statements pass JSON documents instead
# (batch_sql.py).
_inbox = load_queries("rewards_membership", "sql/inbox.sql")
_dead_letters = load_queries("rewards_membership", "sql/dead_letters.sql")
_agent = load_queries("rewards_membership", "sql/agent.sql")
_projection = load_queries("rewards_membership", "sql/projection.sql")


@dataclass(frozen=True, slots=True)
class AgentRow:
    """One row of `agent show`: its fields are the statement's columns (`class_row`)."""

    company_id: UUID
    membership_status: str | None
    leave_reason: str | None
    left_at: datetime | None
    effective_at: datetime | None
    first_activity_at: datetime | None
    last_activity_at: datetime | None
    last_membership_version: int
    version: int
    deals_closed_count: int
    fixations_count: int
    commission_accrued_amount: Decimal
    commission_paid_amount: Decimal
    updated_at: datetime


_AGENT_ROWS: Final = _agent.compose("agent_rows", columns=columns(AgentRow))


class MembershipStore:
    """The consumer's database side: one connection, (re)opened lazily after a failure.

    One connection, not a pool: the consumer applies one batch at a time on one thread, and
    owning the reconnect keeps its timing under the consumer's backoff.
    """

    def __init__(
        self,
        dsn: str,
        *,
        application_name: str,
        session: SessionLimits,
        on_refused: OnRefused | None = None,
    ) -> None:
        """`on_refused`: told of each reconnect whose login PostgreSQL refused."""
        self._conn = LazyConnection(
            lambda: connect(dsn, session, application_name=application_name, on_refused=on_refused)
        )

    def connection(self) -> psycopg.Connection[TupleRow]:
        return self._conn.get()

    def close(self) -> None:
        self._conn.close()

    def discard(self) -> None:
        """Drop the connection after a failure; the next batch reconnects."""
        self._conn.discard()

    @staticmethod
    def apply(
        conn: psycopg.Connection[TupleRow], document: bytes, lock_timeout_ms: int | None = None
    ) -> list[Outcome]:
        """Apply a batch (its `batch_sql.records_document`) in the caller's transaction, in
        one statement; every record's outcome, in order. `lock_timeout_ms`: the lock
        timeout of this transaction alone (sent with the statement, no round trip of its
        own in a pipeline), else the session's.

        Raises `ConcurrentApplyError` when another writer changed, created or recorded
        something of the batch after the statement's snapshot: the caller rolls back and
        decides again.
        """
        if lock_timeout_ms is not None:
            conn.execute(_projection.local_lock_timeout, {"lock_timeout": f"{lock_timeout_ms}ms"})
        try:
            # The document's bytes go as they are, typed json: no decoding, no copy.
            records = Json(document, dumps=_as_is)
            answer = conn.execute(APPLY_BATCH, {"records": records}).fetchone()
        except psycopg.errors.UniqueViolation as exc:
            # Another instance created the row or recorded the key after our snapshot.
            raise ConcurrentApplyError(str(exc)) from exc
        if answer is None:  # pragma: no cover - the statement always answers one row
            raise AssertionError("the batch statement returned no row")
        letters, changed, updated = answer
        if updated != changed:
            raise ConcurrentApplyError(
                f"{changed - updated} row(s) changed by another writer since read"
            )
        return decode_outcomes(letters or "")

    @staticmethod
    def seen_keys(conn: psycopg.Connection[TupleRow], keys: Sequence[str]) -> set[str]:
        """Those of `keys` already in the inbox (read only)."""
        if not keys:
            return set()
        return {str(key) for (key,) in conn.execute(_inbox.select_seen_keys, {"keys": list(keys)})}

    @staticmethod
    def mark_dead_lettered(conn: psycopg.Connection[TupleRow], keys: Sequence[str]) -> None:
        if keys:
            conn.execute(_inbox.mark_dead_lettered, {"keys": list(keys)})

    @staticmethod
    def probe(conn: psycopg.Connection[TupleRow]) -> None:
        conn.execute(_projection.probe)

    @staticmethod
    def count_unreplayed(conn: psycopg.Connection[TupleRow]) -> int:
        row = conn.execute(_inbox.count_unreplayed).fetchone()
        return int(row[0]) if row is not None else 0


def _as_is(document: bytes) -> bytes:
    return document


Position = tuple[int, int]


def _at(dlq_topic: str, positions: Sequence[Position], **columns: object) -> dict[str, object]:
    """The parameters of a statement over rows at `positions` (partition, offset) of the DLQ:
    the topic, then one array per column, the positions' first."""
    return {
        "topic": dlq_topic,
        "partitions": [p for p, _ in positions],
        "offsets": [o for _, o in positions],
        **columns,
    }


def _rows_at(
    conn: psycopg.Connection[TupleRow],
    statement: str,
    dlq_topic: str,
    positions: Sequence[Position],
) -> list[TupleRow]:
    """The rows `statement` reads for `positions` of the DLQ, in one query; none without a
    query when there are no positions."""
    if not positions:
        return []
    return conn.execute(statement, _at(dlq_topic, positions)).fetchall()


def fetch_replays(
    conn: psycopg.Connection[TupleRow], dlq_topic: str, positions: Sequence[Position]
) -> dict[Position, datetime]:
    """(DLQ partition, offset) -> when it was replayed, for those of `positions` replayed."""
    rows = _rows_at(conn, _dead_letters.select_replays, dlq_topic, positions)
    return {(partition, offset): at for partition, offset, at in rows}


def clear_dead_letter_marks(
    conn: psycopg.Connection[TupleRow], keys: Sequence[str]
) -> dict[str, str]:
    """Delete the dead-letter marks of ``keys``; the outcome each deleted mark had."""
    if not keys:
        return {}
    rows = conn.execute(_inbox.clear_dead_letter_marks, {"keys": list(keys)}).fetchall()
    return {str(key): str(outcome) for key, outcome in rows}


def fetch_dead_letter_marks(
    conn: psycopg.Connection[TupleRow], limit: int
) -> list[tuple[str, datetime]]:
    """(inbox key, when marked) of the dead letters pending, the oldest first, at most `limit`."""
    rows = conn.execute(_inbox.select_dead_letter_marks, {"limit": limit}).fetchall()
    return [(str(key), at) for key, at in rows]


def restore_dead_letter_marks(conn: psycopg.Connection[TupleRow], marks: Mapping[str, str]) -> None:
    """Put back marks `clear_dead_letter_marks` deleted (key -> outcome)."""
    if marks:
        conn.execute(
            _inbox.restore_dead_letter_marks,
            {"keys": list(marks), "outcomes": list(marks.values())},
        )


def record_replays(
    conn: psycopg.Connection[TupleRow],
    dlq_topic: str,
    replays: Sequence[tuple[Position, str | None, str, Position]],
    *,
    forced: bool,
) -> None:
    """Rows of `((dlq partition, offset), inbox key, target topic, (target partition, offset))`."""
    if not replays:
        return
    params = _at(
        dlq_topic,
        [r[0] for r in replays],
        forced=forced,
        keys=[r[1] for r in replays],
        targets=[r[2] for r in replays],
        target_partitions=[r[3][0] for r in replays],
        target_offsets=[r[3][1] for r in replays],
    )
    conn.execute(_dead_letters.insert_replays, params)


class Resolution(NamedTuple):
    at: datetime
    reason: str


def fetch_resolutions(
    conn: psycopg.Connection[TupleRow], dlq_topic: str, positions: Sequence[Position]
) -> dict[Position, Resolution]:
    """(DLQ partition, offset) -> when and why it was resolved, for those of `positions`."""
    rows = _rows_at(conn, _dead_letters.select_resolutions, dlq_topic, positions)
    return {(partition, offset): Resolution(at, reason) for partition, offset, at, reason in rows}


def resolve_dead_letter_marks(conn: psycopg.Connection[TupleRow], keys: Sequence[str]) -> set[str]:
    """Close the open dead-letter marks among ``keys``; the keys closed."""
    if not keys:
        return set()
    cursor = conn.execute(_inbox.resolve_dead_letter_marks, {"keys": list(keys)})
    return {row[0] for row in cursor}


def record_resolutions(
    conn: psycopg.Connection[TupleRow],
    dlq_topic: str,
    resolutions: Sequence[tuple[Position, str | None]],
    *,
    reason: str,
) -> set[Position]:
    """Rows of `((dlq partition, offset), inbox key closed)`; the positions recorded now."""
    if not resolutions:
        return set()
    params = _at(
        dlq_topic, [r[0] for r in resolutions], reason=reason, keys=[r[1] for r in resolutions]
    )
    cursor = conn.execute(_dead_letters.insert_resolutions, params)
    return {(partition, offset) for partition, offset in cursor}


def fetch_agent_rows(conn: psycopg.Connection[TupleRow], agent_user_id: UUID) -> list[AgentRow]:
    with conn.cursor(row_factory=class_row(AgentRow)) as cursor:
        return cursor.execute(_AGENT_ROWS, {"agent": agent_user_id}).fetchall()


def prune_inbox(
    conn: psycopg.Connection[TupleRow],
    older_than: timedelta,
    *,
    now: datetime,
    chunk: int = 10_000,
    dry_run: bool = False,
) -> int:
    """Delete inbox marks processed before `now - older_than`, chunk by chunk; return count.

    `dry_run`: the same chunks inside one transaction, rolled back: exactly the marks the
    prune would delete, nothing deleted (a chunk rolled back on its own would be found again
    by the next one)."""
    if dry_run:
        with conn.transaction(force_rollback=True):
            return _prune_chunks(conn, now - older_than, chunk)
    return _prune_chunks(conn, now - older_than, chunk)


def _prune_chunks(conn: psycopg.Connection[TupleRow], before: datetime, chunk: int) -> int:
    total = 0
    while True:
        with conn.transaction():
            deleted = conn.execute(_inbox.prune_inbox, {"before": before, "limit": chunk}).rowcount
        total += deleted
        if deleted < chunk:
            return total
