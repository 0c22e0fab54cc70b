"""A worker's batch built inside PostgreSQL: one statement pages the users, builds every
user's UserAccessChanged record and INSERTs the outbox rows (`write_page`, sql/fanout.sql).

Building each event in Python (structs, `pin_contracts.encode`, headers, a COPY row) cost
80-100 us of worker CPU per user while the connection idled in its transaction; the same
JSON built by PostgreSQL next to the rows it reads costs a fraction of that and needs no
round trip per page step. The wire does not change: the statement writes the JSON that
`pin_contracts.encode` writes (same names, order and formats), and everything per batch
that the contract defines (event type, versions, change reason, header names, trace
headers, OccurredAt, CorrelationId) is taken from `pin_contracts` here, JSON-encoded by
msgspec, and passed in as parameters. `tests/test_page_writer_integration.py` decodes what
the statement wrote and compares it with the Python builder's event for the same rows.

The inline fan-out of small roles and the membership producer keep the Python builder
(`snapshot.build_events`, `outbox.outbox_message`): few events, no hot path.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final, NamedTuple
from uuid import UUID

import msgspec
from psycopg import Connection, sql
from psycopg.rows import TupleRow

from identity_fanout.fanout.shards import END, START
from identity_fanout.outbox.lanes import SLOTS
from pin_contracts import (
    CONTRACT_VERSION_HEADER,
    EVENT_TYPE_HEADER,
    MESSAGE_ID_HEADER,
    USER_ACCESS_CHANGED,
    AccessChangeReason,
    UserAccessChangedKafkaEvent,
    trace_headers,
)
from pin_runtime.sql import load_queries

__all__ = ["WRITE_PAGE", "PageOf", "WrittenPage", "page_parameters", "write_page"]

_fanout = load_queries("identity_fanout", "fanout/sql/fanout.sql")
WRITE_PAGE: Final = _fanout.compose("write_page", page=sql.SQL(_fanout.page_users))
"""The statement, with the page query of `page_users` (one keyset rule for both paths)."""
_EVENT = UserAccessChangedKafkaEvent


def _json(value: object) -> str:
    return msgspec.json.encode(value).decode()


class PageOf(NamedTuple):
    """Which page of which role change: the unit's role and range, where the last batch
    stopped, and the batch size."""

    role_id: UUID
    role_company_id: UUID | None
    version: int
    after: UUID | None
    upper: UUID | None
    limit: int


class WrittenPage(NamedTuple):
    users: int
    """Outbox rows written: one per user of the page."""
    last_user: UUID | None
    """The page's last UserId (the checkpoint's Cursor); None for an empty page."""


def page_parameters(
    page: PageOf,
    *,
    correlation_id: str | None,
    trace_context: dict[str, str],
    occurred_at: datetime | None = None,
) -> dict[str, Any]:
    """The statement's parameters: the page, and the batch's contract constants as JSON."""
    when = datetime.now(UTC) if occurred_at is None else occurred_at
    return {
        "role_id": page.role_id,
        "role_company_id": page.role_company_id,
        "version": page.version,
        "after": page.after or START,
        "upper": page.upper or END,
        "limit": page.limit,
        "topic": USER_ACCESS_CHANGED.name,
        "event_type": _EVENT.EVENT_TYPE,
        "event_type_json": _json(_EVENT.EVENT_TYPE),
        "contract_version": _EVENT.CONTRACT_VERSION,
        "aggregate_type_json": _json(_EVENT.AGGREGATE_TYPE),
        "change_reason_json": _json(AccessChangeReason.ROLE_PERMISSIONS_CHANGED.value),
        "occurred_at_json": _json(when),
        "correlation_id_json": _json(correlation_id),
        "event_type_header": EVENT_TYPE_HEADER,
        "contract_version_header": CONTRACT_VERSION_HEADER,
        "message_id_header": MESSAGE_ID_HEADER,
        # As outbox.outbox_message stores them: [name, text] pairs.
        "trace_headers": _json(
            [
                [name, value.decode() if isinstance(value, bytes) else value or ""]
                for name, value in trace_headers(trace_context)
            ]
        ),
        "slots": SLOTS,
    }


def write_page(
    conn: Connection[TupleRow],
    page: PageOf,
    *,
    correlation_id: str | None,
    trace_context: dict[str, str],
) -> WrittenPage:
    """Write the outbox rows of the next page in the caller's transaction (no NOTIFY)."""
    params = page_parameters(page, correlation_id=correlation_id, trace_context=trace_context)
    row = conn.execute(WRITE_PAGE, params).fetchone()
    if row is None:  # an aggregate over the page: always one row
        return WrittenPage(0, None)
    return WrittenPage(int(row[0]), row[1])
