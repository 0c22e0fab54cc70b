"""Splitting a large task into shards, on its first claim.

The split happens in the worker, not in set-role-permissions: the permission change stays
one short transaction whatever the role's size, and the split is fenced by the claim, so
exactly one worker splits a task (a worker dying mid-split rolls it back and the task's
lease expires as before).
"""

from __future__ import annotations

from uuid import UUID

from psycopg import Connection
from psycopg.rows import TupleRow

from identity_fanout.channels import TASKS_CHANNEL, notify
from identity_fanout.fanout.batch import count_users_up_to
from identity_fanout.fanout.shards import shard_count_for, shard_ranges, split_step
from identity_fanout.fanout.tasks import FanOutTask
from pin_contracts import FanOutTaskStatus
from pin_runtime.sql import load_queries

__all__ = ["split_task", "splittable"]

_fanout = load_queries("identity_fanout", "fanout/sql/fanout.sql")
_shards = load_queries("identity_fanout", "fanout/sql/shards.sql")


def splittable(task: FanOutTask) -> bool:
    """Only a task that has not started as one unit is split: a cursor means it had."""
    return (
        task.status == FanOutTaskStatus.IN_PROGRESS.value
        and task.shard_count == 0
        and task.cursor is None
        and task.processed_count == 0
    )


def split_task(conn: Connection[TupleRow], task: FanOutTask, *, shard_size: int) -> int:
    """Split a freshly claimed task of a large role into shards; their number, 0 if small.

    Zero leaves the task one unit, untouched. Otherwise the shard rows are written and the
    task gives up its lease in one transaction fenced by the claim, and the workers are
    woken to take the shards.
    """
    with conn.transaction():
        gate = count_users_up_to(conn, task.role_id, shard_size + 1)
        if shard_count_for(gate, shard_size) == 0:
            return 0
        counted = conn.execute(_fanout.count_users, {"role_id": task.role_id}).fetchone()
        users = counted[0] if counted else 0
        shards = shard_count_for(users, shard_size)
        if shards == 0:
            return 0
        bounds: list[UUID] = [
            row[0]
            for row in conn.execute(
                _shards.split_bounds,
                {
                    "role_id": task.role_id,
                    "step": split_step(users, shards),
                    "bounds": shards - 1,
                },
            )
        ]
        ranges = shard_ranges(bounds)
        marked = conn.execute(
            _shards.mark_split,
            {"id": task.id, "attempt": task.attempt_count, "shards": len(ranges)},
        ).rowcount
        if marked != 1:  # the claim was lost meanwhile: leave the task to its new holder
            return 0
        conn.execute(
            _shards.insert_shards,
            {
                "task_id": task.id,
                "lowers": [lower for lower, _ in ranges],
                "uppers": [upper for _, upper in ranges],
            },
        )
        notify(conn, TASKS_CHANNEL, str(task.id))
    return len(ranges)
