"""One batch of a unit of work: page, snapshot, outbox rows and the fenced checkpoint.

Everything of a batch commits together or not at all (spec step 7): either the batch's
events are in the outbox and the Cursor moved past them, or neither happened and a restart
repeats at most this one batch. A task walked as one unit and a shard of a large task run
the same batch (`_page`); a shard's batch then rolls its task row up, last in the
transaction, so the task row's lock is held only for the roll-up and the commit: workers on
other shards of the same task wait for each other only that long.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple, TypedDict, Unpack
from uuid import UUID

import msgspec
from psycopg import Connection
from psycopg.rows import TupleRow, class_row

from identity_fanout.channels import OUTBOX_CHANNEL, notify
from identity_fanout.errors import LeaseLostError, TaskSupersededError
from identity_fanout.fanout.claim import Claim, shard_claim, task_claim
from identity_fanout.fanout.page_writer import PageOf, write_page
from identity_fanout.fanout.rollup import roll_up_task
from identity_fanout.fanout.shards import END, START, ClaimedShard
from identity_fanout.fanout.snapshot import AssignmentRow, build_events
from identity_fanout.fanout.tasks import FanOutTask
from identity_fanout.outbox.writer import current_trace_context, outbox_message, write_outbox
from pin_contracts import USER_ACCESS_CHANGED, UserAccessChangedKafkaEvent, envelope_for
from pin_runtime.sql import load_queries
from pin_runtime.structs import built_from

__all__ = [
    "BatchOptions",
    "BatchResult",
    "count_users_up_to",
    "lost_claim",
    "page_users",
    "process_batch",
    "process_shard_batch",
    "snapshot_events",
    "write_events",
]

_fanout = load_queries("identity_fanout", "fanout/sql/fanout.sql")
_tasks = load_queries("identity_fanout", "fanout/sql/tasks.sql")


class BatchResult(msgspec.Struct, frozen=True, kw_only=True):
    """One committed batch of a unit (a whole task, or one shard of it)."""

    users: int
    cursor: UUID | None
    unit_completed: bool
    """The unit's last page: a task's, or a shard's."""
    task_completed: bool
    """This batch completed the whole task (a shard: its last one): observe and log it once."""
    task_processed_count: int
    created_at: datetime
    task_started_at: datetime
    """The task's first claim (StartedAt): its duration runs from it, whole or sharded."""


def count_users_up_to(conn: Connection[TupleRow], role_id: UUID, limit: int) -> int:
    """The role's distinct active users, counted up to ``limit`` at most."""
    row = conn.execute(_fanout.count_users_up_to, {"role_id": role_id, "limit": limit}).fetchone()
    return int(row[0]) if row else 0


def page_users(
    conn: Connection[TupleRow],
    role_id: UUID,
    after: UUID | None,
    limit: int,
    *,
    upper: UUID | None = None,
) -> list[UUID]:
    """The next ``limit`` distinct users of the role's Active assignments after ``after``
    (up to ``upper`` inclusive: a shard's range)."""
    params = {"role_id": role_id, "after": after or START, "upper": upper or END, "limit": limit}
    return [row[0] for row in conn.execute(_fanout.page_users, params)]


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
    with conn.cursor(row_factory=class_row(AssignmentRow)) as cur:
        rows = cur.execute(_fanout.snapshot_rows, {"user_ids": user_ids}).fetchall()
    return build_events(
        user_ids, rows, role_id=role_id, role_company_id=role_company_id, version=version
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


class BatchOptions(TypedDict):
    """How a unit's batch runs (the worker's settings and the run's jobRunId)."""

    batch_size: int
    lease: timedelta
    correlation_id: str


class _Unit(NamedTuple):
    """What a batch needs of its unit: the claim it fences by (and its table's statements),
    its task, the role it fans out and the unit's range of UserIds (None: open)."""

    claim: Claim
    task_id: UUID
    role_id: UUID
    company_id: UUID | None
    version: int
    lower: UUID | None = None
    upper: UUID | None = None


class _Page(msgspec.Struct, frozen=True, kw_only=True):
    users: int
    cursor: UUID | None
    unit_completed: bool
    unit_processed_count: int


def _page(conn: Connection[TupleRow], unit: _Unit, **options: Unpack[BatchOptions]) -> _Page:
    """The batch of one unit, inside the caller's transaction; LeaseLostError if fenced.

    The fence (the unit's row lock, matched on this claim) comes first: it proves the claim
    is still ours before any event is built, so a fenced-off worker does no wasted work.
    Then one statement pages the users and writes their outbox rows (`page_writer`), the
    checkpoint moves past them, and the relay is woken on commit.
    """
    claim = unit.claim
    fence = {"id": claim.id, "attempt": claim.attempt}
    current = conn.execute(claim.statements.lock_cursor, fence).fetchone()
    if current is None:
        raise lost_claim(conn, claim, unit.task_id)
    cursor: UUID | None = current[0]
    batch_size = options["batch_size"]
    page = PageOf(
        role_id=unit.role_id,
        role_company_id=unit.company_id,
        version=unit.version,
        after=cursor or unit.lower,
        upper=unit.upper,
        limit=batch_size,
    )
    written = write_page(
        conn,
        page,
        correlation_id=options["correlation_id"],
        trace_context=current_trace_context(),
    )
    last = written.users < batch_size
    checkpoint = conn.execute(
        claim.statements.checkpoint,
        {
            **fence,
            "cursor": written.last_user,
            "count": written.users,
            "last": last,
            "lease": options["lease"],
        },
    ).fetchone()
    if checkpoint is None:  # cannot happen under the row lock taken above; kept as a fence
        raise LeaseLostError(claim.id, claim.attempt)
    if written.users:
        notify(conn, OUTBOX_CHANNEL)
    return _Page(
        users=written.users,
        cursor=written.last_user or cursor,
        unit_completed=last,
        unit_processed_count=checkpoint[0],
    )


def lost_claim(conn: Connection[TupleRow], claim: Claim, task_id: UUID) -> LeaseLostError:
    """Why a fence failed: a newer version of the role superseded the task, or the lease
    ran out and another worker holds the unit now."""
    row = conn.execute(_tasks.superseded_by, {"id": task_id}).fetchone()
    if row is not None and row[0] is not None:
        return TaskSupersededError(task_id, claim.attempt, row[0])
    return LeaseLostError(claim.id, claim.attempt)


def process_batch(
    conn: Connection[TupleRow], task: FanOutTask, **options: Unpack[BatchOptions]
) -> BatchResult:
    """Fan out the next page of ``task`` in one transaction; raise LeaseLostError if fenced."""
    unit = _Unit(task_claim(task), task.id, task.role_id, task.company_id, task.role_version)
    with conn.transaction():
        page = _page(conn, unit, **options)
    return built_from(
        BatchResult,
        page,
        task_completed=page.unit_completed,
        task_processed_count=page.unit_processed_count,
        created_at=task.created_at,
        task_started_at=task.started_at or task.created_at,
    )


def process_shard_batch(
    conn: Connection[TupleRow], claimed: ClaimedShard, **options: Unpack[BatchOptions]
) -> BatchResult:
    """Fan out the next page of the shard and roll its task up, in one transaction;
    LeaseLostError if fenced."""
    shard = claimed.shard
    unit = _Unit(
        shard_claim(shard),
        shard.task_id,
        claimed.role_id,
        claimed.company_id,
        claimed.role_version,
        lower=shard.lower_bound,
        upper=shard.upper_bound,
    )
    with conn.transaction():
        page = _page(conn, unit, **options)
        task = roll_up_task(conn, shard)
    return built_from(
        BatchResult,
        page,
        task_completed=task.rollup.completed_now,
        task_processed_count=task.rollup.processed_count,
        created_at=task.created_at,
        task_started_at=task.started_at or task.created_at,
    )
