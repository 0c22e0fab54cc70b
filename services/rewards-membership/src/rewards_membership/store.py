"""SQL of the rewards schema, and the one connection the consumer applies batches on.

A batch is four statements whatever its size: read the inbox keys it carries, lock the rows
it touches, then (pipelined) update/insert rows and insert inbox keys from arrays.
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

# Array parameters use binary placeholders (%(x)b): text-dumping a 2,000-element array
# quotes every element through a regex, which dominated the batch's Python time.

# -- select_seen_keys: which of the batch's idempotency keys were already processed
SELECT_SEEN_KEYS: Final = """
SELECT idempotency_key FROM rewards.inbox WHERE idempotency_key = ANY(%(keys)b::text[])
"""

# -- lock_rows: the existing rows of the batch's (agent, agency) pairs, locked for the batch.
# Ordered by key so two instances locking overlapping sets never deadlock.
LOCK_ROWS: Final = """
SELECT ap.agent_user_id, ap.company_id, ap.membership_status, ap.leave_reason, ap.left_at,
       ap.effective_at, ap.first_activity_at, ap.last_activity_at,
       ap.last_membership_version, ap.version
FROM rewards.agent_performance AS ap
JOIN unnest(%(agents)b::uuid[], %(companies)b::uuid[]) AS k (agent_user_id, company_id)
  ON ap.agent_user_id = k.agent_user_id AND ap.company_id = k.company_id
ORDER BY ap.agent_user_id, ap.company_id
FOR UPDATE OF ap
"""

# -- update_rows: membership columns only; earned metrics are not named here on purpose.
# The version condition repeats the guard in SQL: the rows are locked, so it always holds.
UPDATE_ROWS: Final = """
UPDATE rewards.agent_performance AS ap
SET membership_status = u.membership_status,
    leave_reason = u.leave_reason,
    left_at = u.left_at,
    effective_at = u.effective_at,
    first_activity_at = u.first_activity_at,
    last_activity_at = u.last_activity_at,
    last_membership_version = u.last_membership_version,
    version = u.version,
    updated_at = now()
FROM unnest(
    %(agents)b::uuid[], %(companies)b::uuid[], %(statuses)b::text[], %(reasons)b::text[],
    %(left_at)b::timestamptz[], %(effective_at)b::timestamptz[],
    %(first_activity_at)b::timestamptz[], %(last_activity_at)b::timestamptz[],
    %(last_membership_versions)b::bigint[], %(versions)b::bigint[]
) AS u (agent_user_id, company_id, membership_status, leave_reason, left_at, effective_at,
        first_activity_at, last_activity_at, last_membership_version, version)
WHERE ap.agent_user_id = u.agent_user_id AND ap.company_id = u.company_id
  AND ap.last_membership_version < u.last_membership_version
"""

# -- insert_rows: lazily created rows; earned metrics take their zero defaults. No ON
# CONFLICT: a row another instance created meanwhile fails the batch, which is re-decided.
INSERT_ROWS: Final = """
INSERT INTO rewards.agent_performance (
    agent_user_id, company_id, membership_status, leave_reason, left_at, effective_at,
    first_activity_at, last_activity_at, last_membership_version, version)
SELECT * FROM unnest(
    %(agents)b::uuid[], %(companies)b::uuid[], %(statuses)b::text[], %(reasons)b::text[],
    %(left_at)b::timestamptz[], %(effective_at)b::timestamptz[],
    %(first_activity_at)b::timestamptz[], %(last_activity_at)b::timestamptz[],
    %(last_membership_versions)b::bigint[], %(versions)b::bigint[])
"""

# -- insert_inbox: idempotency marks; a key another instance recorded first fails the batch.
INSERT_INBOX: Final = """
INSERT INTO rewards.inbox (idempotency_key, outcome)
SELECT * FROM unnest(%(keys)b::text[], %(outcomes)b::text[])
"""

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


def _row_params(rows: Sequence[MembershipRow]) -> dict[str, list[Any]]:
    return {
        "agents": [r.agent_user_id for r in rows],
        "companies": [r.company_id for r in rows],
        "statuses": [r.membership_status for r in rows],
        "reasons": [r.leave_reason for r in rows],
        "left_at": [r.left_at for r in rows],
        "effective_at": [r.effective_at for r in rows],
        "first_activity_at": [r.first_activity_at for r in rows],
        "last_activity_at": [r.last_activity_at for r in rows],
        "last_membership_versions": [r.last_membership_version for r in rows],
        "versions": [r.version for r in rows],
    }


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
    def seen_keys(conn: psycopg.Connection[TupleRow], keys: Sequence[str]) -> set[str]:
        if not keys:
            return set()
        return {key for (key,) in conn.execute(SELECT_SEEN_KEYS, {"keys": list(keys)})}

    @staticmethod
    def lock_rows(
        conn: psycopg.Connection[TupleRow], keys: Sequence[RowKey]
    ) -> dict[RowKey, MembershipRow]:
        if not keys:
            return {}
        cursor = conn.execute(
            LOCK_ROWS,
            {"agents": [a for a, _ in keys], "companies": [c for _, c in keys]},
        )
        rows: dict[RowKey, MembershipRow] = {}
        for agent, company, status, reason, left, effective, first, last, lmv, ver in cursor:
            rows[(agent, company)] = MembershipRow(
                agent_user_id=agent,
                company_id=company,
                membership_status=status,
                leave_reason=reason,
                left_at=left,
                effective_at=effective,
                first_activity_at=first,
                last_activity_at=last,
                last_membership_version=lmv,
                version=ver,
            )
        return rows

    @staticmethod
    def write(conn: psycopg.Connection[TupleRow], plan: BatchPlan) -> None:
        """Rows and inbox marks of a decided batch, pipelined (one round trip)."""
        try:
            with conn.pipeline(), conn.cursor() as cursor:
                if plan.updates:
                    cursor.execute(UPDATE_ROWS, _row_params(plan.updates))
                if plan.inserts:
                    cursor.execute(INSERT_ROWS, _row_params(plan.inserts))
                if plan.inbox:
                    cursor.execute(
                        INSERT_INBOX,
                        {
                            "keys": [key for key, _ in plan.inbox],
                            "outcomes": [outcome.value for _, outcome in plan.inbox],
                        },
                    )
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
