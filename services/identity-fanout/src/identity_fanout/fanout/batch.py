"""One batch of a unit: the fence, the page written into the outbox by one statement, the
checkpoint and, for a shard, the roll-up onto its task, in one transaction.

Everything of a batch commits together or not at all (spec step 7): either the batch's
events are in the outbox and the Cursor moved past them, or neither happened and a restart
repeats at most this one batch. The fence (the unit's row lock, matched on the claim) comes
first: it proves the claim is still ours before any event is built, so a fenced-off worker
does no wasted work. A shard's roll-up comes last, so the task row's lock is held only for
the roll-up and the commit: workers on other shards of the same task wait for each other
only that long.

The page is written by `page.write_page`, the statement that builds every user's event
inside PostgreSQL (the one builder, which set-role-permissions' inline path uses too).
"""

from __future__ import annotations

from uuid import UUID

import msgspec
from psycopg import Connection
from psycopg.rows import TupleRow

from identity_fanout.fanout.page import PageOf, write_page
from identity_fanout.fanout.queue import FanoutQueue, Unit
from identity_fanout.outbox.writer import current_trace_context

__all__ = ["BatchResult", "run_batch"]


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
