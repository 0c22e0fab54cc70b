"""The outbox quarantine: rows refused for good, kept whole (`Quarantine`, its one gateway).

The relay moves a refused row here in ONE statement with its DELETE from the outbox (the
payload never leaves the server), so the row is either still in the outbox or in the
quarantine, never lost and never in both. An operator lists it, fixes the cause (a topic
limit) and retries it: the row goes back to the tail of the outbox under a new id,
carrying its attempt count and first failure, in one transaction with a NOTIFY for the relay.
A row that can never go out is discarded, with an audit row and an audit log line naming who
and why; the rows the service guards (`OutboxTables.needs_force`: an access event, possibly
a revocation) only with `force`.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

import msgspec
import psycopg
from psycopg import sql
from psycopg.rows import TupleRow, class_row, kwargs_row

from identity_fanout.outbox.errors import DiscardNeedsForceError, QuarantinedRowNotFoundError
from identity_fanout.outbox.tables import OutboxTables
from pin_runtime.logging import log_event
from pin_runtime.postgres import notify
from pin_runtime.sql import load_queries

if TYPE_CHECKING:  # the relay's type only: the operator commands load no Kafka client
    from identity_fanout.outbox.settlement import Refusal

__all__ = [
    "DiscardedRow",
    "MovedRow",
    "Operator",
    "Quarantine",
    "QuarantineEntry",
    "QuarantinedRow",
    "RequeuedRow",
]

_log = logging.getLogger("identity_fanout.outbox.quarantine")
_q = load_queries("identity_fanout", "outbox/sql/quarantine.sql")


class QuarantineEntry(msgspec.Struct, frozen=True, kw_only=True):
    """What names a quarantined row in every log line about it: which row, what it carries
    and whose it is."""

    quarantine_id: int
    topic: str
    key: str
    message_id: UUID
    event_type: str

    def log_fields(self, tables: OutboxTables) -> dict[str, object]:
        """The row's log fields; the key under the name of the id it is
        (`OutboxTables.key_field`: `userId`, ...)."""
        return {
            "quarantineId": self.quarantine_id,
            "topic": self.topic,
            "eventType": self.event_type,
            "messageId": str(self.message_id),
            tables.key_field(self.event_type): self.key,
        }


class DiscardedRow(QuarantineEntry, frozen=True, kw_only=True):
    """A quarantined row an operator discarded (what the audit row and log line name)."""

    outbox_id: int
    error_code: str
    error_reason: str
    attempts: int
    database_login: str
    """session_user of the discarding session: who logged in."""
    database_role: str
    """current_user: the role the delete ran as."""

    def log_fields(self, tables: OutboxTables) -> dict[str, object]:
        return super().log_fields(tables) | {
            "outboxId": self.outbox_id,
            "errorCode": self.error_code,
            "errorReason": self.error_reason,
            "attempts": self.attempts,
            "databaseLogin": self.database_login,
            "databaseRole": self.database_role,
        }


class Operator(msgspec.Struct, frozen=True, kw_only=True):
    """Who runs a discard besides the database login: the process's OS user and host.

    In the ops pod the OS user is the container's, so the database login (a personal login
    granted the operator group) is the one that names the person; both are kept."""

    os_user: str
    host: str

    @classmethod
    def of_this_process(cls) -> Operator:
        try:
            user = getpass.getuser()
        except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
            user = f"uid {os.getuid()}"
        return cls(os_user=user, host=socket.gethostname())


class MovedRow(QuarantineEntry, frozen=True, kw_only=True):
    """A row the relay has just quarantined (what its log line names)."""

    outbox_id: int
    attempts: int
    size: int

    def log_fields(self, tables: OutboxTables) -> dict[str, object]:
        fields = {"outboxId": self.outbox_id, "attempts": self.attempts, "sizeBytes": self.size}
        return super().log_fields(tables) | fields


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


def _quarantined(*, headers: Any, **fields: Any) -> QuarantinedRow:
    # Headers are stored as a JSON array of [name, value] pairs; an object is read as well.
    pairs = headers.items() if isinstance(headers, dict) else (headers or [])
    return QuarantinedRow(
        **fields, headers=tuple((str(n), None if v is None else str(v)) for n, v in pairs)
    )


class Quarantine:
    """Every statement on the quarantine of one service's outbox (`tables`)."""

    __slots__ = ("_counts", "_discard", "_get", "_list", "_move", "_requeue", "tables")

    def __init__(self, tables: OutboxTables) -> None:
        self.tables = tables
        self._move = tables.compose(_q, "move")
        self._counts = tables.compose(_q, "count_by_topic")
        self._list = tables.compose(_q, "select_quarantined", filter=sql.SQL(_q.oldest_first))
        self._get = tables.compose(_q, "select_quarantined", filter=sql.SQL(_q.by_id))
        self._requeue = tables.compose(_q, "requeue")
        self._discard = tables.compose(_q, "discard")

    def needs_force(self, entry: QuarantineEntry) -> bool:
        """Whether discarding `entry` needs `force` (`OutboxTables.needs_force`)."""
        return self.tables.needs_force(entry.topic, entry.event_type)

    def move(
        self, conn: psycopg.Connection[TupleRow], refusals: Sequence[Refusal]
    ) -> list[MovedRow]:
        """Move the refused rows into the quarantine (autocommit: one statement, atomic)."""
        if not refusals:
            return []
        params = {
            "ids": [r.record.id for r in refusals],
            "codes": [r.failure.code for r in refusals],
            "reasons": [r.failure.reason for r in refusals],
            "messages": [r.failure.message for r in refusals],
        }
        with conn.cursor(row_factory=class_row(MovedRow)) as cur:
            # Unprepared, as every statement of the relay that finds outbox rows by id.
            return cur.execute(self._move, params, prepare=False).fetchall()

    def counts(self, conn: psycopg.Connection[TupleRow]) -> dict[str, int]:
        """Quarantined rows by topic."""
        return dict(conn.execute(self._counts).fetchall())

    def rows(self, conn: psycopg.Connection[TupleRow], *, limit: int = 100) -> list[QuarantinedRow]:
        """The quarantine in the order rows were refused (oldest first)."""
        with conn.cursor(row_factory=kwargs_row(_quarantined)) as cur:
            return cur.execute(self._list, {"limit": limit}).fetchall()

    def get(self, conn: psycopg.Connection[TupleRow], row_id: int) -> QuarantinedRow:
        with conn.cursor(row_factory=kwargs_row(_quarantined)) as cur:
            row = cur.execute(self._get, {"id": row_id}).fetchone()
        if row is None:
            raise QuarantinedRowNotFoundError(row_id)
        return row

    def _requeue_rows(
        self,
        conn: psycopg.Connection[TupleRow],
        *,
        ids: list[int],
        everything: bool,
        dry_run: bool = False,
    ) -> list[RequeuedRow]:
        with conn.transaction(force_rollback=dry_run):
            with conn.cursor(row_factory=class_row(RequeuedRow)) as cur:
                rows = cur.execute(self._requeue, {"all": everything, "ids": ids}).fetchall()
            if rows and not dry_run:
                notify(conn, self.tables.channel)
        return rows

    def retry(
        self, conn: psycopg.Connection[TupleRow], row_id: int, *, dry_run: bool = False
    ) -> RequeuedRow:
        """Row `row_id` back to the tail of the outbox; `QuarantinedRowNotFoundError` if absent.

        `dry_run`: the same statement, rolled back (as `retry_all`'s)."""
        moved = self._requeue_rows(conn, ids=[row_id], everything=False, dry_run=dry_run)
        if not moved:
            raise QuarantinedRowNotFoundError(row_id)
        return moved[0]

    def retry_all(
        self, conn: psycopg.Connection[TupleRow], *, dry_run: bool = False
    ) -> list[RequeuedRow]:
        """Every quarantined row back to the tail of the outbox, in the order they were refused.

        `dry_run`: the same statement, rolled back: exactly the rows it would move, nothing
        moved (their outbox ids are then only what they would have been)."""
        return self._requeue_rows(conn, ids=[], everything=True, dry_run=dry_run)

    def discard(
        self,
        conn: psycopg.Connection[TupleRow],
        row_id: int | None,
        *,
        reason: str,
        operator: Operator,
        force: bool = False,
        dry_run: bool = False,
    ) -> list[DiscardedRow]:
        """Delete quarantined row `row_id` (None: every row) for good: one transaction that
        writes an audit row per row (the `discards` table), then one WARNING log line per row
        naming it, its key, who (`operator`, the database login) and the operator's `reason`
        (the audit trail).

        `DiscardNeedsForceError` without `force` when a guarded row is among them (nothing
        is discarded); `QuarantinedRowNotFoundError` when `row_id` is not there. `dry_run`:
        the same statement and checks, rolled back, no audit row nor log line: the rows it
        would discard."""
        params = {
            "all": row_id is None,
            "ids": [] if row_id is None else [row_id],
            "forced": force,
            "reason": reason,
            "os_user": operator.os_user,
            "host": operator.host,
        }
        with (
            conn.transaction(force_rollback=dry_run),
            conn.cursor(row_factory=class_row(DiscardedRow)) as cur,
        ):
            rows = cur.execute(self._discard, params).fetchall()
            protected = [row for row in rows if self.needs_force(row)]
            if protected and not force:  # raised inside the transaction: nothing was deleted
                raise DiscardNeedsForceError(
                    [row.quarantine_id for row in protected], self.tables.guard
                )
        if row_id is not None and not rows:
            raise QuarantinedRowNotFoundError(row_id)
        for row in () if dry_run else rows:
            log_event(
                _log,
                "outbox quarantined row discarded",
                logging.WARNING,
                **row.log_fields(self.tables),
                forced=force,
                osUser=operator.os_user,
                host=operator.host,
                reason=reason,
            )
        return rows
