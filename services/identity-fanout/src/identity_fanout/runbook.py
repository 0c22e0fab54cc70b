"""What the runbook's CLI commands do to the queue: list, show, replay."""

from __future__ import annotations

from typing import Final
from uuid import UUID

from psycopg import Connection
from psycopg.rows import TupleRow, class_row

from identity_fanout import shard_queries
from identity_fanout.errors import TaskNotFailedError, TaskNotFoundError
from identity_fanout.queries import NOTIFY_TASKS, TASK_COLUMNS
from identity_fanout.shards import FanOutShard
from identity_fanout.tasks import FanOutTask
from pin_contracts import FanOutTaskStatus

_SELECT: Final = f"SELECT {', '.join(TASK_COLUMNS)} FROM identity.access_fanout_tasks"

# Spec runbook "Failed-задачи (poison)": Status -> Pending, AttemptCount = 0, after the cause
# is fixed. The snapshot semantics make a repeat safe. The Cursor is kept: users before it
# already received this RoleVersion's events.
_REPLAY: Final = """
UPDATE identity.access_fanout_tasks
SET status = 'Pending', attempt_count = 0, lease_expires_at = NULL, completed_at = NULL,
    updated_at = now()
WHERE id = %(id)s AND status = 'Failed' AND shard_count = 0
"""


def list_tasks(
    conn: Connection[TupleRow], *, status: FanOutTaskStatus | None = None, limit: int = 50
) -> list[FanOutTask]:
    """Newest first; only ``status`` when given."""
    with conn.cursor(row_factory=class_row(FanOutTask)) as cur:
        if status is None:
            cur.execute(f"{_SELECT} ORDER BY created_at DESC, id LIMIT %(limit)s", {"limit": limit})
        else:
            cur.execute(
                f"{_SELECT} WHERE status = %(status)s ORDER BY created_at DESC, id LIMIT %(limit)s",
                {"status": status.value, "limit": limit},
            )
        return cur.fetchall()


def get_task(conn: Connection[TupleRow], task_id: UUID) -> FanOutTask:
    with conn.cursor(row_factory=class_row(FanOutTask)) as cur:
        task = cur.execute(f"{_SELECT} WHERE id = %(id)s", {"id": task_id}).fetchone()
    if task is None:
        raise TaskNotFoundError(task_id)
    return task


def list_shards(conn: Connection[TupleRow], task_id: UUID) -> list[FanOutShard]:
    """The shards of a task in range order; empty for a task fanned out as one unit."""
    with conn.cursor(row_factory=class_row(FanOutShard)) as cur:
        return cur.execute(shard_queries.SELECT_SHARDS, {"task_id": task_id}).fetchall()


def replay_task(conn: Connection[TupleRow], task_id: UUID) -> FanOutTask:
    """Put a Failed task back in the queue (and wake the workers); the task as it is now.

    A sharded task gets its Failed shards back (attempts reset, cursors kept) and returns to
    InProgress, where its shards are claimable; its finished shards are not repeated.
    """
    with conn.transaction():
        # Shards before the task: the order in which workers lock them (no deadlock).
        conn.execute(shard_queries.REPLAY_SHARDS, {"task_id": task_id})
        updated = conn.execute(_REPLAY, {"id": task_id}).rowcount
        if updated != 1:
            updated = conn.execute(shard_queries.REPLAY_SHARDED_TASK, {"id": task_id}).rowcount
        if updated != 1:
            current = get_task(conn, task_id)
            raise TaskNotFailedError(task_id, current.status)
        conn.execute(NOTIFY_TASKS, {"task_id": task_id})
    return get_task(conn, task_id)
