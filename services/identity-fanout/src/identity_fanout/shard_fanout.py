"""One batch of a shard: page within its range, snapshot, outbox, fenced checkpoint, roll-up.

As for an unsharded task everything of the batch commits together or not at all (spec step
7); the shard's own row is the fence and the checkpoint. The task row is rolled up last, so
its lock is held only for the roll-up and the commit: workers on other shards of the same
task wait for each other only that long.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

import msgspec
from psycopg import Connection
from psycopg.rows import TupleRow

from identity_fanout import shard_queries
from identity_fanout.errors import LeaseLostError
from identity_fanout.fanout import snapshot_events, write_events
from identity_fanout.shards import ClaimedShard, ShardState, roll_up


class ShardBatchResult(msgspec.Struct, frozen=True, kw_only=True):
    users: int
    cursor: UUID | None
    shard_completed: bool
    task_completed: bool
    """This batch completed the whole task (its last shard): observe and log it once."""
    task_processed_count: int
    created_at: datetime
    started_at: datetime | None


def process_shard_batch(
    conn: Connection[TupleRow],
    claimed: ClaimedShard,
    *,
    batch_size: int,
    lease: timedelta,
    correlation_id: str,
) -> ShardBatchResult:
    """Fan out the next page of the shard in one transaction; LeaseLostError if fenced."""
    shard = claimed.shard
    fence = {"id": shard.id, "attempt": shard.attempt_count}
    with conn.transaction():
        current = conn.execute(shard_queries.LOCK_SHARD, fence).fetchone()
        if current is None:
            raise LeaseLostError(shard.id, shard.attempt_count)
        cursor: UUID | None = current[0]
        rows = conn.execute(
            shard_queries.PAGE_SHARD_USERS,
            {
                "role_id": claimed.role_id,
                "after": cursor or shard.lower_bound,
                "upper": shard.upper_bound,
                "limit": batch_size,
            },
        ).fetchall()
        users: list[UUID] = [row[0] for row in rows]
        last = len(users) < batch_size
        checkpoint = conn.execute(
            shard_queries.SHARD_CHECKPOINT,
            {
                **fence,
                "cursor": users[-1] if users else None,
                "count": len(users),
                "last": last,
                "lease": lease,
            },
        ).fetchone()
        if checkpoint is None:  # cannot happen under the row lock taken above; kept as a fence
            raise LeaseLostError(shard.id, shard.attempt_count)
        events = snapshot_events(
            conn,
            users,
            role_id=claimed.role_id,
            role_company_id=claimed.company_id,
            version=claimed.role_version,
        )
        write_events(conn, events, correlation_id=correlation_id)
        locked = conn.execute(shard_queries.LOCK_TASK, {"id": shard.task_id}).fetchone()
        task_status: str = locked[0] if locked else "Failed"
        states = [
            ShardState(
                shard_no=no, status=status, lower_bound=lower, cursor=cur, processed_count=count
            )
            for no, status, lower, cur, count in conn.execute(
                shard_queries.SHARD_STATES, {"task_id": shard.task_id}
            )
        ]
        rollup = roll_up(task_status, states)
        task = conn.execute(
            shard_queries.TASK_ROLLUP,
            {
                "id": shard.task_id,
                "processed": rollup.processed_count,
                "cursor": rollup.cursor,
                "status": rollup.status,
                "completed": rollup.completed_now,
            },
        ).fetchone()
        if task is None:  # the task row is locked above and cascades to its shards
            raise LeaseLostError(shard.id, shard.attempt_count)
    return ShardBatchResult(
        users=len(users),
        cursor=users[-1] if users else cursor,
        shard_completed=last,
        task_completed=rollup.completed_now,
        task_processed_count=rollup.processed_count,
        created_at=task[0],
        started_at=task[1],
    )
