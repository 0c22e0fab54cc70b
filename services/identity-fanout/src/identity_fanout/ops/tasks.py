"""What the runbook's CLI commands do to the queue: list, show, replay."""

from __future__ import annotations

from typing import Final
from uuid import UUID

from psycopg import Connection, sql
from psycopg.rows import TupleRow, class_row

from identity_fanout.channels import TASKS_CHANNEL, notify
from identity_fanout.errors import TaskNotFailedError, TaskNotFoundError
from identity_fanout.fanout.shards import FanOutShard
from identity_fanout.fanout.tasks import FanOutTask
from pin_contracts import FanOutTaskStatus
from pin_runtime.sql import columns, load_queries

_tasks = load_queries("identity_fanout", "fanout/sql/tasks.sql")
_shards = load_queries("identity_fanout", "fanout/sql/shards.sql")


def _select_tasks(filter_: str) -> str:
    return _tasks.compose(
        "select_tasks", columns=columns(FanOutTask), filter=sql.SQL(_tasks[filter_])
    )


_NEWEST: Final = _select_tasks("newest_first")
_NEWEST_WITH_STATUS: Final = _select_tasks("newest_first_with_status")
_BY_ID: Final = _select_tasks("by_id")
_SHARDS: Final = _shards.compose("select_shards", columns=columns(FanOutShard))


def list_tasks(
    conn: Connection[TupleRow], *, status: FanOutTaskStatus | None = None, limit: int = 50
) -> list[FanOutTask]:
    """Newest first; only ``status`` when given."""
    with conn.cursor(row_factory=class_row(FanOutTask)) as cur:
        if status is None:
            return cur.execute(_NEWEST, {"limit": limit}).fetchall()
        return cur.execute(_NEWEST_WITH_STATUS, {"status": status.value, "limit": limit}).fetchall()


def get_task(conn: Connection[TupleRow], task_id: UUID) -> FanOutTask:
    with conn.cursor(row_factory=class_row(FanOutTask)) as cur:
        task = cur.execute(_BY_ID, {"id": task_id}).fetchone()
    if task is None:
        raise TaskNotFoundError(task_id)
    return task


def list_shards(conn: Connection[TupleRow], task_id: UUID) -> list[FanOutShard]:
    """The shards of a task in range order; empty for a task fanned out as one unit."""
    with conn.cursor(row_factory=class_row(FanOutShard)) as cur:
        return cur.execute(_SHARDS, {"task_id": task_id}).fetchall()


def replay_task(conn: Connection[TupleRow], task_id: UUID) -> FanOutTask:
    """Put a Failed task back in the queue (and wake the workers); the task as it is now.

    A sharded task gets its Failed shards back (attempts reset, cursors kept) and returns to
    InProgress, where its shards are claimable; its finished shards are not repeated.
    """
    with conn.transaction():
        # Shards before the task: the order in which workers lock them (no deadlock).
        conn.execute(_shards.replay_shards, {"task_id": task_id})
        if conn.execute(_tasks.replay_task, {"id": task_id}).rowcount != 1:
            current = get_task(conn, task_id)
            raise TaskNotFailedError(task_id, current.status)
        notify(conn, TASKS_CHANNEL, str(task_id))
    return get_task(conn, task_id)
