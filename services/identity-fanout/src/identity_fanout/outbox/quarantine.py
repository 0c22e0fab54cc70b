"""The outbox quarantine's rows as the relay, the operator commands and the audit trail name
them (the statements are the store's: `OutboxStore.move_to_quarantine`, `quarantined`,
`requeue`, `discard`).

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
import os
import socket
from datetime import datetime
from typing import Any
from uuid import UUID

import msgspec

from identity_fanout.outbox.tables import OutboxTables

__all__ = [
    "DiscardedRow",
    "MovedRow",
    "Operator",
    "QuarantineEntry",
    "QuarantinedRow",
    "RequeuedRow",
    "quarantined_row",
]


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


def quarantined_row(*, headers: Any, **fields: Any) -> QuarantinedRow:
    """A `select_quarantined` row as a `QuarantinedRow` (a psycopg `kwargs_row` factory)."""
    # Headers are stored as a JSON array of [name, value] pairs; an object is read as well.
    pairs = headers.items() if isinstance(headers, dict) else (headers or [])
    return QuarantinedRow(
        **fields, headers=tuple((str(n), None if v is None else str(v)) for n, v in pairs)
    )
