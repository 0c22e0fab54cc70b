"""SQL of the rewards schema, and the one connection the consumer applies batches on.

A batch is five set-based statements whatever its size (`batch_sql.py`), in two round trips:
read the inbox keys it carries and lock the rows it touches (pipelined), then update/insert
rows and insert inbox keys (pipelined).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Final
from uuid import UUID

import psycopg
from psycopg.rows import TupleRow

from pin_runtime.postgres import SessionLimits
from rewards_membership.batch_sql import (
    INSERT_INBOX,
    INSERT_ROWS,
    LOCK_ROWS,
    SELECT_SEEN_KEYS,
    UPDATE_ROWS,
    decode_rows,
    inbox_document,
    keys_document,
    row_keys_document,
    rows_document,
)
from rewards_membership.errors import ConcurrentApplyError
from rewards_membership.guard import MembershipRow
from rewards_membership.plan import BatchPlan, RowKey

__all__ = [
    "AgentRow",
    "MembershipStore",
    "clear_dead_letter_marks",
    "connect",
    "fetch_agent_rows",
    "fetch_replays",
    "prune_inbox",
    "record_replays",
]

_log = logging.getLogger(__name__)

# Array parameters use binary placeholders (%(x)b): text-dumping an array quotes every
# element through a regex. The batch statements pass JSON documents instead (batch_sql.py).

# -- mark_dead_lettered: inbox marks of dead letters whose DLQ copy the broker acknowledged.
# ON CONFLICT: a mark already there (another instance, an earlier try) is the same fact.
MARK_DEAD_LETTERED: Final = """
INSERT INTO rewards.inbox (idempotency_key, outcome)
SELECT unnest(%(keys)b::text[]), 'dead-lettered'
ON CONFLICT (idempotency_key) DO NOTHING
"""

# -- count_unreplayed: dead letters whose mark no replay has cleared yet (partial index)
COUNT_UNREPLAYED: Final = """
SELECT count(*) FROM rewards.inbox WHERE outcome = 'dead-lettered'
"""

# -- select_replays: which of a page of DLQ records were replayed already, and when
SELECT_REPLAYS: Final = """
SELECT r.dlq_partition, r.dlq_offset, r.replayed_at
FROM rewards.dlq_replays AS r
JOIN unnest(%(partitions)b::integer[], %(offsets)b::bigint[]) AS k (dlq_partition, dlq_offset)
  ON r.dlq_partition = k.dlq_partition AND r.dlq_offset = k.dlq_offset
WHERE r.dlq_topic = %(topic)s
"""

# -- clear_dead_letter_marks: before a replay, so the consumer processes the copy again
CLEAR_DEAD_LETTER_MARKS: Final = """
DELETE FROM rewards.inbox
WHERE idempotency_key = ANY(%(keys)b::text[]) AND outcome = 'dead-lettered'
"""

# -- insert_replays: DLQ records whose republished copy the broker acknowledged
INSERT_REPLAYS: Final = """
INSERT INTO rewards.dlq_replays (dlq_topic, dlq_partition, dlq_offset, idempotency_key,
                                 target_topic, target_partition, target_offset, forced)
SELECT %(topic)s, p, o, k, t, tp, tof, %(forced)s
FROM unnest(%(partitions)b::integer[], %(offsets)b::bigint[], %(keys)b::text[],
            %(targets)b::text[], %(target_partitions)b::integer[],
            %(target_offsets)b::bigint[]) AS r (p, o, k, t, tp, tof)
ON CONFLICT (dlq_topic, dlq_partition, dlq_offset) DO NOTHING
"""

# -- agent_rows: every row of one agent, for `agent show`
AGENT_ROWS: Final = """
SELECT company_id, membership_status, leave_reason, left_at, effective_at,
       first_activity_at, last_activity_at, last_membership_version, version,
       deals_closed_count, fixations_count, commission_accrued_amount,
       commission_paid_amount, updated_at
FROM rewards.agent_performance
WHERE agent_user_id = %(agent)s
ORDER BY company_id
"""

# -- prune_inbox: one chunk of marks older than the cut-off (chunks keep transactions short).
# Dead-letter marks stay: they are the dead letters not yet replayed (a replay removes them).
PRUNE_INBOX: Final = """
DELETE FROM rewards.inbox
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM rewards.inbox
    WHERE processed_at < %(before)s AND outcome <> 'dead-lettered'
    LIMIT %(limit)s))
"""


def connect(
    dsn: str, *, application_name: str, session: SessionLimits
) -> psycopg.Connection[TupleRow]:
    """One autocommit connection with a bounded connect (libpq would otherwise wait forever).

    Autocommit: every unit of work opens its own `conn.transaction()`, which then is a real
    BEGIN/COMMIT and never a savepoint inside an implicit transaction left open by a probe.
    `session` bounds every statement and lock wait of it (`settings.database_session()`).
    """
    return psycopg.connect(
        dsn,
        application_name=application_name,
        connect_timeout=5,
        autocommit=True,
        **session.connect_kwargs(),
    )


class MembershipStore:
    """The consumer's database side: one connection, (re)opened lazily after a failure.

    One connection, not a pool: the consumer applies one batch at a time on one thread, and
    owning the reconnect keeps its timing under the consumer's backoff.
    """

    def __init__(self, dsn: str, *, application_name: str, session: SessionLimits) -> None:
        self._dsn = dsn
        self._application_name = application_name
        self._session = session
        self._conn: psycopg.Connection[TupleRow] | None = None

    def connection(self) -> psycopg.Connection[TupleRow]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            self._conn = connect(
                self._dsn, application_name=self._application_name, session=self._session
            )
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def discard(self) -> None:
        """Drop the connection after a failure; the next batch reconnects."""
        try:
            self.close()
        except psycopg.Error:
            _log.debug("closing a failed connection failed", exc_info=True)

    @staticmethod
    def read(
        conn: psycopg.Connection[TupleRow], keys: Sequence[str], row_keys: Sequence[RowKey]
    ) -> tuple[set[str], dict[RowKey, MembershipRow]]:
        """The batch's keys already in the inbox, and its existing rows locked: one round
        trip (both statements pipelined)."""
        seen_cursor, rows_cursor = conn.cursor(), conn.cursor()
        try:
            with conn.pipeline():
                if keys:
                    seen_cursor.execute(SELECT_SEEN_KEYS, {"keys": keys_document(keys)})
                if row_keys:
                    rows_cursor.execute(LOCK_ROWS, {"keys": row_keys_document(row_keys)})
            seen = {key for (key,) in seen_cursor} if keys else set()
            rows: dict[RowKey, MembershipRow] = {}
            if row_keys:
                (document,) = rows_cursor.fetchone() or ("[]",)
                rows = {row.key: row for row in decode_rows(document)}
        finally:
            seen_cursor.close()
            rows_cursor.close()
        return seen, rows

    @staticmethod
    def write(conn: psycopg.Connection[TupleRow], plan: BatchPlan) -> None:
        """Rows and inbox marks of a decided batch, one statement each, pipelined."""
        try:
            with conn.pipeline(), conn.cursor() as cursor:
                if plan.updates:
                    cursor.execute(UPDATE_ROWS, {"rows": rows_document(plan.updates)})
                if plan.inserts:
                    cursor.execute(INSERT_ROWS, {"rows": rows_document(plan.inserts)})
                if plan.inbox:
                    cursor.execute(INSERT_INBOX, {"marks": inbox_document(plan.inbox)})
        except psycopg.errors.UniqueViolation as exc:
            # Another instance created the row or recorded the key after our read.
            raise ConcurrentApplyError(str(exc)) from exc

    @staticmethod
    def mark_dead_lettered(conn: psycopg.Connection[TupleRow], keys: Sequence[str]) -> None:
        if keys:
            conn.execute(MARK_DEAD_LETTERED, {"keys": list(keys)})

    @staticmethod
    def count_unreplayed(conn: psycopg.Connection[TupleRow]) -> int:
        row = conn.execute(COUNT_UNREPLAYED).fetchone()
        return int(row[0]) if row is not None else 0


Position = tuple[int, int]


def fetch_replays(
    conn: psycopg.Connection[TupleRow], dlq_topic: str, positions: Sequence[Position]
) -> dict[Position, datetime]:
    """(DLQ partition, offset) -> when it was replayed, for those of `positions` replayed."""
    if not positions:
        return {}
    cursor = conn.execute(
        SELECT_REPLAYS,
        {
            "topic": dlq_topic,
            "partitions": [p for p, _ in positions],
            "offsets": [o for _, o in positions],
        },
    )
    return {(partition, offset): at for partition, offset, at in cursor}


def clear_dead_letter_marks(conn: psycopg.Connection[TupleRow], keys: Sequence[str]) -> None:
    if keys:
        conn.execute(CLEAR_DEAD_LETTER_MARKS, {"keys": list(keys)})


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
    conn.execute(
        INSERT_REPLAYS,
        {
            "topic": dlq_topic,
            "forced": forced,
            "partitions": [r[0][0] for r in replays],
            "offsets": [r[0][1] for r in replays],
            "keys": [r[1] for r in replays],
            "targets": [r[2] for r in replays],
            "target_partitions": [r[3][0] for r in replays],
            "target_offsets": [r[3][1] for r in replays],
        },
    )


AgentRow = dict[str, Any]
"""One row of `agent show`, by column name."""


def fetch_agent_rows(conn: psycopg.Connection[TupleRow], agent_user_id: UUID) -> list[AgentRow]:
    cursor = conn.execute(AGENT_ROWS, {"agent": agent_user_id})
    names = [column.name for column in cursor.description or ()]
    return [dict(zip(names, values, strict=True)) for values in cursor]


def prune_inbox(
    conn: psycopg.Connection[TupleRow],
    older_than: timedelta,
    *,
    now: datetime,
    chunk: int = 10_000,
) -> int:
    """Delete inbox marks processed before `now - older_than`, chunk by chunk; return count."""
    before = now - older_than
    total = 0
    while True:
        with conn.transaction():
            deleted = conn.execute(PRUNE_INBOX, {"before": before, "limit": chunk}).rowcount
        total += deleted
        if deleted < chunk:
            return total
