"""One batch of a fan-out task: page, snapshot, outbox rows and the fenced checkpoint.

Everything of a batch commits together or not at all (spec step 7): either the batch's
events are in the outbox and the Cursor moved past them, or neither happened and a restart
repeats at most this one batch.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final
from uuid import UUID

import msgspec
from psycopg import Connection
from psycopg.rows import TupleRow

from identity_fanout import queries
from identity_fanout.errors import LeaseLostError
from identity_fanout.outbox import current_trace_context, outbox_message, write_outbox
from identity_fanout.snapshot import AssignmentRow, build_events
from identity_fanout.tasks import FanOutTask
from pin_contracts import USER_ACCESS_CHANGED, UserAccessChangedKafkaEvent, envelope_for

# Below every real UserId (the schema forbids the nil UUID): the first page's lower bound.
START: Final = UUID(int=0)


class BatchResult(msgspec.Struct, frozen=True, kw_only=True):
    users: int
    cursor: UUID | None
    completed: bool
    processed_count: int
    created_at: datetime


def page_users(
    conn: Connection[TupleRow], role_id: UUID, after: UUID | None, limit: int
) -> list[UUID]:
    """The next ``limit`` distinct users of the role's Active assignments after ``after``."""
    rows = conn.execute(
        queries.PAGE_USERS, {"role_id": role_id, "after": after or START, "limit": limit}
    ).fetchall()
    return [row[0] for row in rows]


def snapshot_events(
    conn: Connection[TupleRow],
    user_ids: list[UUID],
    *,
    role_id: UUID,
    role_company_id: UUID | None,
    version: int,
) -> list[UserAccessChangedKafkaEvent]:
    """Each user's event with the full snapshot of their active assignments, one query."""
    if not user_ids:
        return []
    rows = conn.execute(queries.SNAPSHOT_ROWS, {"user_ids": user_ids}).fetchall()
    return build_events(
        user_ids,
        (AssignmentRow(*row) for row in rows),
        role_id=role_id,
        role_company_id=role_company_id,
        version=version,
    )


def write_events(
    conn: Connection[TupleRow],
    events: list[UserAccessChangedKafkaEvent],
    *,
    correlation_id: str,
) -> int:
    """Put the events into the outbox of the caller's transaction."""
    trace_context = current_trace_context()
    return write_outbox(
        conn,
        [
            outbox_message(
                envelope_for(event, correlation_id=correlation_id),
                USER_ACCESS_CHANGED,
                trace_context=trace_context,
            )
            for event in events
        ],
    )


def process_batch(
    conn: Connection[TupleRow],
    task: FanOutTask,
    *,
    batch_size: int,
    lease: timedelta,
    correlation_id: str,
) -> BatchResult:
    """Fan out the next page of ``task`` in one transaction; raise LeaseLostError if fenced.

    The checkpoint is written first: it takes the task row's lock and proves the claim is
    still ours before any event is built, so a fenced-off worker does no wasted work.
    """
    with conn.transaction():
        # The cursor is re-read from the row through the fenced update, never trusted from
        # memory: the row is the checkpoint.
        current = conn.execute(
            "SELECT cursor FROM identity.access_fanout_tasks "
            "WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress' "
            "FOR UPDATE",
            {"id": task.id, "attempt": task.attempt_count},
        ).fetchone()
        if current is None:
            raise LeaseLostError(task.id, task.attempt_count)
        cursor: UUID | None = current[0]
        users = page_users(conn, task.role_id, cursor, batch_size)
        last = len(users) < batch_size
        checkpoint = conn.execute(
            queries.CHECKPOINT,
            {
                "id": task.id,
                "attempt": task.attempt_count,
                "cursor": users[-1] if users else None,
                "count": len(users),
                "last": last,
                "lease": lease,
            },
        ).fetchone()
        if checkpoint is None:  # cannot happen under the row lock taken above; kept as a fence
            raise LeaseLostError(task.id, task.attempt_count)
        events = snapshot_events(
            conn,
            users,
            role_id=task.role_id,
            role_company_id=task.company_id,
            version=task.role_version,
        )
        write_events(conn, events, correlation_id=correlation_id)
    return BatchResult(
        users=len(users),
        cursor=users[-1] if users else cursor,
        completed=last,
        processed_count=checkpoint[0],
        created_at=checkpoint[1],
    )
