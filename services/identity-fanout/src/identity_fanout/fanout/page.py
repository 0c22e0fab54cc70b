"""A page of a role change's events, written into the outbox by one statement: the one
builder of the UserAccessChanged record.

Both fan-out paths write their events here. The worker's batch writes the next page of its
unit (`batch.run_batch`); set-role-permissions writes a small role's whole change as one
page from the role's first user (`enqueue.set_role_permissions`). Either way one statement,
`write_page` of sql/fanout.sql, pages the role's users (the keyset query `page_users`,
composed in as `{page}`), builds every user's envelope JSON, headers, MessageId, key and
lane slot inside PostgreSQL next to the rows it reads, and INSERTs the outbox rows (the
INSERT composed by the outbox's store). Built in Python (structs, `pin_contracts.encode`,
headers, a row per event), each event would cost 80-100 µs of CPU while the connection
idles in its transaction (docs/design/identity-fanout.md "How a task runs").

The wire is `pin_contracts`': the statement writes the JSON that `pin_contracts.encode`
writes (same names, order and formats), and everything per page that the contract defines
(event type, versions, change reason, header names, trace headers, OccurredAt,
CorrelationId) is taken from `pin_contracts` here, JSON-encoded by msgspec, and passed in as
parameters. `tests/test_page_writer_integration.py` decodes what the statement wrote for
both callers and compares it with the envelope the test builds from `pin_contracts` structs
for the same rows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final, NamedTuple
from uuid import UUID

import msgspec
from psycopg import Connection, sql
from psycopg.rows import TupleRow

from identity_fanout.fanout.shards import END, START
from identity_fanout.schema import OUTBOX
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
WRITE_PAGE: Final = OUTBOX.writer_statement(_fanout, "write_page", page=sql.SQL(_fanout.page_users))
"""The statement, with the page query of `page_users` (one keyset rule for both paths)."""
_EVENT = UserAccessChangedKafkaEvent


def _json(value: object) -> str:
    return msgspec.json.encode(value).decode()


class PageOf(NamedTuple):
    """Which page of which role change: the role, its tenant (the events' CompanyId where a
    user's assignment of the role carries none), the Version the events carry, the range
    (after ``after``, up to ``upper`` inclusive; None: from the first user, to the last) and
    the page size."""

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
    """The page's last UserId (a unit's checkpoint Cursor); None for an empty page."""


def page_parameters(
    page: PageOf,
    *,
    correlation_id: str | None,
    trace_context: dict[str, str],
    occurred_at: datetime | None = None,
) -> dict[str, Any]:
    """The statement's parameters: the page, and its contract constants as JSON."""
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
        # As the outbox stores every writer's headers: [name, text] pairs.
        "trace_headers": _json(
            [
                [name, value.decode() if isinstance(value, bytes) else value or ""]
                for name, value in trace_headers(trace_context)
            ]
        ),
    }


def write_page(
    conn: Connection[TupleRow],
    page: PageOf,
    *,
    correlation_id: str | None,
    trace_context: dict[str, str],
) -> WrittenPage:
    """Write the outbox rows of ``page`` in the caller's transaction; the relays are woken
    when it commits if any row was written."""
    params = page_parameters(page, correlation_id=correlation_id, trace_context=trace_context)
    row = conn.execute(WRITE_PAGE, params).fetchone()
    if row is None or not row[0]:  # an aggregate over the page: always one row
        return WrittenPage(0, None)
    OUTBOX.wake_relays(conn)  # on commit
    return WrittenPage(int(row[0]), row[1])
