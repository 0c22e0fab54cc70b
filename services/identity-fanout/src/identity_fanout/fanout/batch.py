"""One batch of a unit: the fence, the page written into the outbox by one statement, the
checkpoint and, for a shard, the roll-up onto its task, in one transaction.

Everything of a batch commits together or not at all (spec step 7): either the batch's
events are in the outbox and the Cursor moved past them, or neither happened and a restart
repeats at most this one batch. The fence (the unit's row lock, matched on the claim) comes
first: it proves the claim is still ours before any event is built, so a fenced-off worker
does no wasted work. A shard's roll-up comes last, so the task row's lock is held only for
the roll-up and the commit: workers on other shards of the same task wait for each other
only that long.

The page's events are built inside PostgreSQL: one statement pages the users, builds every
user's UserAccessChanged record and INSERTs the outbox rows (`write_page`, sql/fanout.sql).
Building each event in Python (structs, `pin_contracts.encode`, headers, a COPY row) kept
the worker busy while the connection idled in its transaction; the same JSON built by
PostgreSQL next to the rows it reads costs a fraction of that and needs no round trip per
page step (docs/design/identity-fanout.md "How a task runs"). The wire does not change:
the statement writes the JSON that `pin_contracts.encode` writes (same names, order and
formats), and everything per batch that the contract defines (event type, versions,
change reason, header names, trace headers, OccurredAt, CorrelationId) is taken from
`pin_contracts` here, JSON-encoded by msgspec, and passed in as parameters.
`tests/test_page_writer_integration.py` decodes what the statement wrote and compares it
with the Python builder's event (`inline`) for the same rows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final, NamedTuple
from uuid import UUID

import msgspec
from psycopg import Connection, sql
from psycopg.rows import TupleRow

from identity_fanout.fanout.queue import FanoutQueue, Unit
from identity_fanout.fanout.shards import END, START
from identity_fanout.outbox.writer import current_trace_context
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

__all__ = [
    "WRITE_PAGE",
    "BatchResult",
    "PageOf",
    "WrittenPage",
    "page_parameters",
    "run_batch",
    "write_page",
]


class BatchResult(msgspec.Struct, frozen=True, kw_only=True):
    """One committed batch of a unit (a whole task, or one shard of it)."""

    users: int
    cursor: UUID | None
    unit_completed: bool
    """The unit's last page: a task's, or a shard's."""
    task_completed: bool
    """This batch completed the whole task (a shard: its last one): observe and log it once."""
    task_processed_count: int


def run_batch(
    conn: Connection[TupleRow],
    queue: FanoutQueue,
    unit: Unit,
    *,
    batch_size: int,
    correlation_id: str,
) -> BatchResult:
    """Fan out the next page of ``unit`` in one transaction; LeaseLostError (or
    TaskSupersededError) if the claim is no longer ours."""
    with conn.transaction():
        cursor = queue.fence(conn, unit)
        page = PageOf(
            role_id=unit.role_id,
            role_company_id=unit.company_id,
            version=unit.role_version,
            after=cursor or unit.lower_bound,
            upper=unit.upper_bound,
            limit=batch_size,
        )
        written = write_page(
            conn, page, correlation_id=correlation_id, trace_context=current_trace_context()
        )
        last = written.users < batch_size
        processed = queue.checkpoint(
            conn, unit, cursor=written.last_user, users=written.users, last=last
        )
        if written.users:
            OUTBOX.wake_relays(conn)  # on commit
        task_completed, task_processed = last, processed
        if unit.shard_no is not None:
            rollup = queue.roll_up(conn, unit)
            task_completed, task_processed = rollup.completed_now, rollup.processed_count
    return BatchResult(
        users=written.users,
        cursor=written.last_user or cursor,
        unit_completed=last,
        task_completed=task_completed,
        task_processed_count=task_processed,
    )


# -- the statement that writes a page -------------------------------------------------------

_fanout = load_queries("identity_fanout", "fanout/sql/fanout.sql")
WRITE_PAGE: Final = OUTBOX.writer_statement(_fanout, "write_page", page=sql.SQL(_fanout.page_users))
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
        # As outbox.writer.outbox_message stores them: [name, text] pairs.
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
    """Write the outbox rows of the next page in the caller's transaction (no NOTIFY)."""
    params = page_parameters(page, correlation_id=correlation_id, trace_context=trace_context)
    row = conn.execute(WRITE_PAGE, params).fetchone()
    if row is None:  # an aggregate over the page: always one row
        return WrittenPage(0, None)
    return WrittenPage(int(row[0]), row[1])
