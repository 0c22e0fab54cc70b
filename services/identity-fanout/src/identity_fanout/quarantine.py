"""The outbox quarantine (`identity.outbox_quarantine`): rows refused for good, kept whole.

The relay moves a refused row here in ONE statement with its DELETE from the outbox (the
payload never leaves the server), so the row is either still in the outbox or in the
quarantine, never lost and never in both. An operator lists it, fixes the cause (a topic
limit, an ACL) and retries it: the row goes back to the tail of the outbox under a new id,
carrying its attempt count and first failure, in one transaction with a NOTIFY for the relay.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final
from uuid import UUID

import msgspec
import psycopg
from psycopg.rows import TupleRow

from identity_fanout.errors import QuarantinedRowNotFoundError
from identity_fanout.outbox import OUTBOX_CHANNEL
from identity_fanout.relay_settlement import Refusal

__all__ = [
    "MovedRow",
    "QuarantinedRow",
    "RequeuedRow",
    "get_quarantined",
    "list_quarantined",
    "quarantine_counts",
    "quarantine_rows",
    "retry_all",
    "retry_quarantined",
]

MOVE: Final = """
WITH refused AS (
    SELECT *
      FROM unnest(%(ids)s::bigint[], %(codes)s::text[], %(reasons)s::text[], %(messages)s::text[])
           AS r (outbox_id, error_code, error_reason, error_message)
), moved AS (
    DELETE FROM identity.outbox AS o
     USING refused AS r
     WHERE o.id = r.outbox_id
    RETURNING o.*, r.error_code, r.error_reason, r.error_message
)
INSERT INTO identity.outbox_quarantine (
    outbox_id, topic, message_key, payload, headers, message_id, event_type, created_at,
    error_code, error_reason, error_message, attempts, first_failed_at, last_failed_at, key_slot
)
SELECT id, topic, message_key, payload, headers, message_id, event_type, created_at,
       error_code, error_reason, error_message,
       quarantine_attempts + 1,
       coalesce(first_failed_at, statement_timestamp()),
       statement_timestamp(),
       key_slot
  FROM moved
 ORDER BY id
RETURNING id, outbox_id, topic, message_key, message_id, event_type, attempts,
          octet_length(payload)
"""
"""Refused rows out of the outbox and into the quarantine, one statement (one transaction).
A row already gone from the outbox (deleted by hand meanwhile) is simply not moved."""

COUNT_BY_TOPIC: Final = """
SELECT topic, count(*) FROM identity.outbox_quarantine GROUP BY topic ORDER BY topic
"""

_COLUMNS: Final = """
id, outbox_id, topic, message_key, message_id, event_type, created_at, error_code,
error_reason, error_message, attempts, first_failed_at, last_failed_at, octet_length(payload),
headers
"""

LIST: Final = f"SELECT {_COLUMNS} FROM identity.outbox_quarantine ORDER BY id LIMIT %(limit)s"

GET: Final = f"SELECT {_COLUMNS} FROM identity.outbox_quarantine WHERE id = %(id)s"

REQUEUE: Final = """
WITH moved AS (
    DELETE FROM identity.outbox_quarantine
     WHERE (%(all)s OR id = ANY(%(ids)s))
    RETURNING *
), requeued AS (
    INSERT INTO identity.outbox (
        topic, message_key, payload, headers, message_id, event_type,
        quarantine_attempts, first_failed_at, key_slot
    )
    SELECT topic, message_key, payload, headers, message_id, event_type,
           attempts, first_failed_at, key_slot
      FROM moved
     ORDER BY id
    RETURNING id, message_id
)
SELECT m.id, r.id, m.topic, m.message_key, m.attempts
  FROM moved AS m
  JOIN requeued AS r ON r.message_id = m.message_id
 ORDER BY r.id
"""
"""Quarantined rows back to the tail of the outbox (new ids, in quarantine order, the same
key slot), keeping their attempt count and first failure so that a second refusal counts on."""

NOTIFY: Final = "SELECT pg_notify(%(channel)s, '')"


class MovedRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row the relay has just quarantined (what its log line names)."""

    quarantine_id: int
    outbox_id: int
    topic: str
    key: str
    message_id: UUID
    event_type: str
    attempts: int
    size: int


class QuarantinedRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row of the quarantine as `outbox quarantine list/show` print it (no payload)."""

    id: int
    outbox_id: int
    topic: str
    key: str
    message_id: UUID
    event_type: str
    created_at: datetime
    error_code: str
    error_reason: str
    error_message: str
    attempts: int
    first_failed_at: datetime
    last_failed_at: datetime
    size: int
    """Bytes of the record value (the payload), the figure a size limit compares."""
    headers: tuple[tuple[str, str | None], ...]


class RequeuedRow(msgspec.Struct, frozen=True, kw_only=True):
    """A quarantined row put back in the outbox."""

    quarantine_id: int
    outbox_id: int
    topic: str
    key: str
    attempts: int


def quarantine_rows(
    conn: psycopg.Connection[TupleRow], refusals: Sequence[Refusal]
) -> list[MovedRow]:
    """Move the refused rows into the quarantine (autocommit: one statement, atomic)."""
    if not refusals:
        return []
    rows = conn.execute(
        MOVE,
        {
            "ids": [r.record.id for r in refusals],
            "codes": [r.failure.code for r in refusals],
            "reasons": [r.failure.reason for r in refusals],
            "messages": [r.failure.message for r in refusals],
        },
    ).fetchall()
    return [
        MovedRow(
            quarantine_id=row[0],
            outbox_id=row[1],
            topic=row[2],
            key=row[3],
            message_id=row[4],
            event_type=row[5],
            attempts=row[6],
            size=row[7],
        )
        for row in rows
    ]


def quarantine_counts(conn: psycopg.Connection[TupleRow]) -> dict[str, int]:
    return dict(conn.execute(COUNT_BY_TOPIC).fetchall())


def _quarantined(row: TupleRow) -> QuarantinedRow:
    raw_headers = row[14]
    pairs = raw_headers.items() if isinstance(raw_headers, dict) else (raw_headers or [])
    return QuarantinedRow(
        id=row[0],
        outbox_id=row[1],
        topic=row[2],
        key=row[3],
        message_id=row[4],
        event_type=row[5],
        created_at=row[6],
        error_code=row[7],
        error_reason=row[8],
        error_message=row[9],
        attempts=row[10],
        first_failed_at=row[11],
        last_failed_at=row[12],
        size=row[13],
        headers=tuple((str(n), None if v is None else str(v)) for n, v in pairs),
    )


def list_quarantined(
    conn: psycopg.Connection[TupleRow], *, limit: int = 100
) -> list[QuarantinedRow]:
    """The quarantine in the order rows were refused (oldest first)."""
    return [_quarantined(row) for row in conn.execute(LIST, {"limit": limit}).fetchall()]


def get_quarantined(conn: psycopg.Connection[TupleRow], row_id: int) -> QuarantinedRow:
    row = conn.execute(GET, {"id": row_id}).fetchone()
    if row is None:
        raise QuarantinedRowNotFoundError(row_id)
    return _quarantined(row)


def _requeue(
    conn: psycopg.Connection[TupleRow], *, ids: list[int], everything: bool
) -> list[RequeuedRow]:
    with conn.transaction():
        rows = conn.execute(REQUEUE, {"all": everything, "ids": ids}).fetchall()
        if rows:
            conn.execute(NOTIFY, {"channel": OUTBOX_CHANNEL})
    return [
        RequeuedRow(quarantine_id=r[0], outbox_id=r[1], topic=r[2], key=r[3], attempts=r[4])
        for r in rows
    ]


def retry_quarantined(conn: psycopg.Connection[TupleRow], row_id: int) -> RequeuedRow:
    """Row `row_id` back to the tail of the outbox; `QuarantinedRowNotFoundError` if absent."""
    moved = _requeue(conn, ids=[row_id], everything=False)
    if not moved:
        raise QuarantinedRowNotFoundError(row_id)
    return moved[0]


def retry_all(conn: psycopg.Connection[TupleRow]) -> list[RequeuedRow]:
    """Every quarantined row back to the tail of the outbox, in the order they were refused."""
    return _requeue(conn, ids=[], everything=True)
