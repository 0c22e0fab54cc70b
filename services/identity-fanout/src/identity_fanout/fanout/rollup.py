"""The roll-up of a shard batch onto its task row, last in the batch's transaction.

`shards.roll_up` decides it from the shards' states; this module reads them and writes the
task row (the statements' order and why are in `sql/shards.sql`).
"""

from __future__ import annotations

from datetime import datetime

import msgspec
from psycopg import Connection
from psycopg.rows import TupleRow, class_row

from identity_fanout.errors import LeaseLostError
from identity_fanout.fanout.shards import FanOutShard, Rollup, ShardState, roll_up
from pin_runtime.sql import load_queries

__all__ = ["TaskRollup", "roll_up_task"]

_shards = load_queries("identity_fanout", "fanout/sql/shards.sql")


class TaskRollup(msgspec.Struct, frozen=True, kw_only=True):
    rollup: Rollup
    created_at: datetime
    started_at: datetime | None


def roll_up_task(conn: Connection[TupleRow], shard: FanOutShard) -> TaskRollup:
    """Lock the task row, roll the shards' states up onto it; LeaseLostError if it is gone."""
    locked = conn.execute(_shards.lock_task, {"id": shard.task_id}).fetchone()
    task_status: str = locked[0] if locked else "Failed"
    with conn.cursor(row_factory=class_row(ShardState)) as cur:
        states = cur.execute(_shards.shard_states, {"task_id": shard.task_id}).fetchall()
    rollup = roll_up(task_status, states)
    task = conn.execute(
        _shards.task_rollup,
        {
            "id": shard.task_id,
            "processed": rollup.processed_count,
            "cursor": rollup.cursor,
            "status": rollup.status,
            "attempts": rollup.attempt_count,
            "lease": rollup.lease_expires_at,
            "completed": rollup.completed_now,
        },
    ).fetchone()
    if task is None:  # the task row is locked above and cascades to its shards
        raise LeaseLostError(shard.id, shard.attempt_count)
    return TaskRollup(rollup=rollup, created_at=task[0], started_at=task[1])
