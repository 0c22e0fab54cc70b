"""Splitting a large task into shards, and claiming, handing back and failing a shard.

The split happens in the worker, on the first claim of a task (not in set-role-permissions):
the permission change stays one short transaction whatever the role's size, and the split is
fenced by the claim, so exactly one worker splits a task (a worker dying mid-split rolls it
back and the task's lease expires as before).
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from psycopg import Connection
from psycopg.rows import TupleRow

from identity_fanout import queries, shard_queries
from identity_fanout.shards import (
    ClaimedShard,
    FanOutShard,
    shard_count_for,
    shard_ranges,
    split_step,
)
from identity_fanout.tasks import FanOutTask
from pin_contracts import FanOutTaskStatus


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
        gate = conn.execute(
            shard_queries.COUNT_USERS_UP_TO, {"role_id": task.role_id, "limit": shard_size + 1}
        ).fetchone()
        if gate is None or shard_count_for(gate[0], shard_size) == 0:
            return 0
        counted = conn.execute(shard_queries.COUNT_USERS, {"role_id": task.role_id}).fetchone()
        shards = shard_count_for(counted[0] if counted else 0, shard_size)
        if shards == 0:
            return 0
        users = counted[0] if counted else 0
        bounds: list[UUID] = [
            row[0]
            for row in conn.execute(
                shard_queries.SPLIT_BOUNDS,
                {
                    "role_id": task.role_id,
                    "step": split_step(users, shards),
                    "bounds": shards - 1,
                },
            )
        ]
        ranges = shard_ranges(bounds)
        marked = conn.execute(
            shard_queries.MARK_SPLIT,
            {"id": task.id, "attempt": task.attempt_count, "shards": len(ranges)},
        ).rowcount
        if marked != 1:  # the claim was lost meanwhile: leave the task to its new holder
            return 0
        conn.execute(
            shard_queries.INSERT_SHARDS,
            {
                "task_id": task.id,
                "lowers": [lower for lower, _ in ranges],
                "uppers": [upper for _, upper in ranges],
            },
        )
        conn.execute(queries.NOTIFY_TASKS, {"task_id": task.id})
    return len(ranges)


def claim_shard(
    conn: Connection[TupleRow], *, lease: timedelta, max_attempts: int
) -> ClaimedShard | None:
    """Claim the next available shard, or None. A Failed one is poison: its task failed."""
    with conn.transaction():
        row = conn.execute(
            shard_queries.CLAIM_SHARD, {"lease": lease, "max_attempts": max_attempts}
        ).fetchone()
        if row is None:
            return None
        *shard_values, role_id, company_id, role_version = row
        shard = FanOutShard(**dict(zip(FanOutShard.__struct_fields__, shard_values, strict=True)))
        if shard.status == FanOutTaskStatus.FAILED.value:
            conn.execute(
                shard_queries.FAIL_TASK,
                {"id": shard.task_id, "error": f"shard {shard.shard_no}: {shard.last_error}"},
            )
    return ClaimedShard(
        shard=shard, role_id=role_id, company_id=company_id, role_version=role_version
    )


def release_shard(conn: Connection[TupleRow], shard: FanOutShard) -> bool:
    """Hand a claimed shard back (graceful stop); False if the claim was no longer ours."""
    with conn.transaction():
        cur = conn.execute(
            shard_queries.RELEASE_SHARD, {"id": shard.id, "attempt": shard.attempt_count}
        )
        return cur.rowcount == 1


def record_shard_failure(
    conn: Connection[TupleRow], shard: FanOutShard, error: str, retry_in: timedelta
) -> bool:
    """Keep why the shard's batch failed and shorten its lease; False if the claim was lost."""
    with conn.transaction():
        cur = conn.execute(
            shard_queries.SHARD_FAILURE,
            {
                "id": shard.id,
                "attempt": shard.attempt_count,
                "error": error[:2000],
                "retry_in": retry_in,
            },
        )
        return cur.rowcount == 1
