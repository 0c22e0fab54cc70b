"""Taking a task from the queue, handing it back, and the retry policy of a failed batch."""

from __future__ import annotations

from datetime import timedelta

from psycopg import Connection
from psycopg.rows import TupleRow, class_row

from identity_fanout import queries
from identity_fanout.tasks import FanOutTask
from pin_contracts import FanOutTaskStatus


def claim_task(
    conn: Connection[TupleRow], *, lease: timedelta, max_attempts: int
) -> FanOutTask | None:
    """Claim the oldest available task (spec step 2), or None when the queue is empty.

    The returned task is InProgress with this claim's attempt_count, or Failed: a task that
    had max_attempts claims already is marked poison instead of claimed, and returned so the
    caller logs and counts it.
    """
    with conn.transaction(), conn.cursor(row_factory=class_row(FanOutTask)) as cur:
        cur.execute(queries.CLAIM_TASK, {"lease": lease, "max_attempts": max_attempts})
        return cur.fetchone()


def is_poisoned(task: FanOutTask) -> bool:
    return task.status == FanOutTaskStatus.FAILED


def release_task(conn: Connection[TupleRow], task: FanOutTask) -> bool:
    """Hand a claimed task back (graceful stop); False if the claim was no longer ours."""
    with conn.transaction():
        cur = conn.execute(queries.RELEASE, {"id": task.id, "attempt": task.attempt_count})
        return cur.rowcount == 1


def retry_delay(attempt: int, *, polling_interval: timedelta, lease: timedelta) -> timedelta:
    """How soon a task whose batch failed may be claimed again: doubling from the polling
    interval with each attempt, never longer than the lease it would have waited anyway."""
    exponent = max(0, min(attempt - 1, 30))
    delay: timedelta = polling_interval * (2**exponent)
    return min(lease, delay)


def record_failure(
    conn: Connection[TupleRow], task: FanOutTask, error: str, retry_in: timedelta
) -> bool:
    """Keep why the batch failed and shorten the lease; False if the claim was lost."""
    with conn.transaction():
        cur = conn.execute(
            queries.RECORD_FAILURE,
            {
                "id": task.id,
                "attempt": task.attempt_count,
                "error": error[:2000],
                "retry_in": retry_in,
            },
        )
        return cur.rowcount == 1
