"""The queue of fan-out work: every statement on the task and shard tables.

A unit of work is a task walked whole or one shard of a large task. Both follow the same
rules (claim with SKIP LOCKED, poison after MaxAttempts, a fenced checkpoint and hand-back,
a shorter lease after a failed batch), so `sql/units.sql` writes each statement once and
`FanoutQueue` composes them for the two tables. The worker hands the queue a connection and
gets domain objects back (a claimed `Unit`, a cursor, a count, a `Rollup`); it never sees
SQL or parameters. The enqueue side (a new task, the supersede of older ones) and the
operator's views (list, show, replay) are here too: every rule about these rows is in this
module and its SQL.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, LiteralString, NamedTuple
from uuid import UUID, uuid4

import msgspec
from psycopg import Connection, sql
from psycopg.rows import TupleRow, class_row

from identity_fanout.errors import (
    LeaseLostError,
    TaskNotFailedError,
    TaskNotFoundError,
    TaskSupersededError,
)
from identity_fanout.fanout import assignments
from identity_fanout.fanout.shards import (
    Rollup,
    ShardState,
    roll_up,
    shard_count_for,
    shard_ranges,
    shard_sizes,
    split_step,
)
from pin_contracts import AccessChangeReason, FanOutTaskStatus
from pin_runtime.logging import log_event
from pin_runtime.postgres import notify
from pin_runtime.sql import columns, load_queries

__all__ = [
    "TASKS_CHANNEL",
    "FanOutShard",
    "FanOutTask",
    "FanoutQueue",
    "QueueState",
    "TaskCounts",
    "Unit",
    "enqueue_task",
    "get_task",
    "list_shards",
    "list_tasks",
    "queue_state",
    "replay_task",
    "retry_delay",
    "shard_progress",
    "supersede_older_tasks",
    "task_counts",
    "unfinished_tasks",
]

_log = logging.getLogger(__name__)

TASKS_CHANNEL: Final = "identity_access_fanout_tasks"
"""Notified on enqueue, on a split and on a replay (the payload is the task id); idle workers
LISTEN and claim at once instead of at their next poll."""
_units = load_queries("identity_fanout", "fanout/sql/units.sql")
_shards = load_queries("identity_fanout", "fanout/sql/shards.sql")
_tasks = load_queries("identity_fanout", "fanout/sql/tasks.sql")

Conn = Connection[TupleRow]


# -- rows -----------------------------------------------------------------------------------


class LeasedRow(msgspec.Struct, frozen=True, kw_only=True):
    """The columns every unit of fan-out work has, a task or a shard: its id, where its
    work stands (status, cursor, count) and the lease and attempts of its claims."""

    id: UUID
    status: str
    cursor: UUID | None
    processed_count: int
    attempt_count: int
    lease_expires_at: datetime | None
    last_error: str | None
    started_at: datetime | None
    completed_at: datetime | None
    updated_at: datetime


class FanOutTask(LeasedRow, frozen=True, kw_only=True):
    """One row of identity.access_fanout_tasks (spec: AccessFanOutTask)."""

    role_id: UUID
    company_id: UUID | None
    role_version: int
    reason: str
    created_at: datetime
    shard_count: int = 0
    """0: one unit; otherwise the number of shards the task was split into."""
    superseded_by_version: int | None = None
    """Set when a newer version of the role took over the users this task had not reached:
    the task is Completed where it stood (its Cursor, its ProcessedCount)."""
    user_count: int | None = None
    """The role's users as the first claim counted them (a small role's exact count, or
    the count a large one was split by); None until a worker claimed the task."""
    role_code: str | None = None
    """The role's Code (joined from role_definitions: the listings name the role)."""


class FanOutShard(LeasedRow, frozen=True, kw_only=True):
    """One row of identity.access_fanout_shards: users in (lower_bound, upper_bound]."""

    task_id: UUID
    shard_no: int
    lower_bound: UUID
    upper_bound: UUID | None
    user_count: int | None = None
    """The users between its bounds at the split (None: split by an older worker)."""


class Unit(msgspec.Struct, frozen=True, kw_only=True):
    """A claimed unit of work, as its walk needs it: the claim is the unit.

    ``id`` (the claimed row: the task's, or the shard's) and ``attempt`` (the claim's
    AttemptCount) are the fencing token every write of the walk matches on.
    """

    id: UUID
    attempt: int
    task_id: UUID
    role_id: UUID
    company_id: UUID | None
    role_version: int
    task_created_at: datetime
    task_started_at: datetime
    """The task's first claim (StartedAt): its duration runs from it, whole or sharded."""
    poisoned: bool = False
    """The unit had MaxAttempts claims already: it was marked Failed instead of claimed
    (a shard's task with it), and comes back only to be logged and counted."""
    last_error: str | None = None
    splittable: bool = False
    """A task that never started as one unit: large, it is split into shards first."""
    shard_no: int | None = None
    """None: the task as one unit."""
    lower_bound: UUID | None = None
    upper_bound: UUID | None = None

    @property
    def kind(self) -> str:
        return "task" if self.shard_no is None else "shard"

    def ids(self) -> dict[str, Any]:
        """The unit's ids as its log lines and spans carry them."""
        ids: dict[str, Any] = {"taskId": str(self.task_id), "roleId": str(self.role_id)}
        if self.shard_no is not None:
            ids["shardNo"] = self.shard_no
        return ids


class TaskCounts(msgspec.Struct, frozen=True, kw_only=True):
    """The unfinished tasks, each counted once (`sql/tasks.sql` task_counts says how):
    what `identity-fanout status` shows."""

    waiting: int
    being_walked: int
    walked_with_shards_waiting: int
    """Of the tasks being walked, those with shards no worker serves yet."""
    oldest_age_seconds: float | None
    """Age of the oldest unfinished task; None when there is none."""


class QueueState(msgspec.Struct, frozen=True):
    """The queue as the worker's gauges and `identity-fanout status` show it
    (`sql/tasks.sql` queue_state says how)."""

    backlog: int
    leased: int
    failed: int
    oldest_age_seconds: float
    oldest_waiting_seconds: float


# -- the statements of a unit, for each table -----------------------------------------------


class _Statements(NamedTuple):
    claim: LiteralString
    lock_cursor: LiteralString
    checkpoint: LiteralString
    record_failure: LiteralString
    touch: LiteralString
    release: LiteralString


def _statements(table: str, candidate: LiteralString, returning: LiteralString) -> _Statements:
    unit = sql.Identifier("identity", table)
    claim = _units.compose(
        "claim", unit=unit, candidate=sql.SQL(candidate), returning=sql.SQL(returning)
    )
    return _Statements(
        claim=claim,
        lock_cursor=_units.compose("lock_cursor", unit=unit),
        checkpoint=_units.compose("checkpoint", unit=unit),
        record_failure=_units.compose("record_failure", unit=unit),
        touch=_units.compose("touch", unit=unit),
        release=_units.compose("release", unit=unit),
    )


_TASK: Final = _statements("access_fanout_tasks", _units.task_candidate, _units.task_returning)
_SHARD: Final = _statements("access_fanout_shards", _units.shard_candidate, _units.shard_returning)


def _of(unit: Unit) -> _Statements:
    return _TASK if unit.shard_no is None else _SHARD


def retry_delay(attempt: int, *, polling_interval: timedelta, lease: timedelta) -> timedelta:
    """How soon a unit whose batch failed may be claimed again: doubling from the polling
    interval with each attempt, never longer than the lease it would have waited anyway."""
    exponent = max(0, min(attempt - 1, 30))
    delay: timedelta = polling_interval * (2**exponent)
    return min(lease, delay)


# -- the worker's side ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class FanoutQueue:
    """The queue as a worker uses it: each method is its own transaction unless it says it
    runs in the caller's (the batch's)."""

    lease: timedelta
    """MaxLeaseDuration: a claim (and each checkpoint or touch) holds a unit this long."""
    max_attempts: int
    """MaxAttempts: a unit claimed this many times without completing is poison."""

    def claim(self, conn: Conn) -> Unit | None:
        """The next unit, or None when nothing is claimable.

        Fair between tasks: a shard of the sharded task whose turn is oldest, unless a whole
        task has waited longer than that turn (`sql/units.sql` shard_candidate); then the
        oldest whole task; then any shard (the whole task it yielded to was claimed by
        another worker meanwhile). A small role waits at most for one shard of a large one.
        """
        return (
            self._claim_shard(conn, fair=True)
            or self._claim_task(conn)
            or self._claim_shard(conn, fair=False)
        )

    def _claim(self, conn: Conn, statements: _Statements, **more: object) -> Unit | None:
        params = {"lease": self.lease, "max_attempts": self.max_attempts, **more}
        with conn.cursor(row_factory=class_row(Unit)) as cur:
            return cur.execute(statements.claim, params).fetchone()

    def _claim_task(self, conn: Conn) -> Unit | None:
        with conn.transaction():
            return self._claim(conn, _TASK)

    def _claim_shard(self, conn: Conn, *, fair: bool) -> Unit | None:
        with conn.transaction():
            unit = self._claim(conn, _SHARD, fair=fair)
            if unit is not None and unit.poisoned:
                error = f"shard {unit.shard_no}: {unit.last_error}"
                conn.execute(_shards.fail_task, {"id": unit.task_id, "error": error})
        return unit

    def split(self, conn: Conn, unit: Unit, *, shard_size: int) -> int:
        """Split a freshly claimed task of a large role into shards; their number, 0 if it
        is small (or the claim was lost meanwhile): then it stays one unit, untouched.

        The split happens in the worker, not in set-role-permissions: the permission change
        stays one short transaction whatever the role's size, and the split is fenced by the
        claim, so exactly one worker splits a task (one dying mid-split rolls it back and
        the task's lease runs out as before). The shard rows are written and the task gives
        up its lease in one transaction; the workers are woken to take the shards.
        """
        with conn.transaction():
            gate = assignments.count_users_up_to(conn, unit.role_id, shard_size + 1)
            if shard_count_for(gate, shard_size) == 0:
                # Small: the gate counted every user; the task's total for `tasks show`.
                params = {"id": unit.id, "attempt": unit.attempt, "users": gate}
                conn.execute(_shards.mark_whole, params)
                return 0
            users = assignments.count_users(conn, unit.role_id)
            shards = shard_count_for(users, shard_size)
            if shards == 0:
                return 0
            step = split_step(users, shards)
            bounds = assignments.split_bounds(conn, unit.role_id, step=step, bounds=shards - 1)
            ranges = shard_ranges(bounds)
            marked = conn.execute(
                _shards.mark_split,
                {"id": unit.id, "attempt": unit.attempt, "shards": len(ranges), "users": users},
            ).rowcount
            if marked != 1:  # the claim was lost meanwhile: leave the task to its new holder
                return 0
            conn.execute(
                _shards.insert_shards,
                {
                    "task_id": unit.id,
                    "lowers": [lower for lower, _ in ranges],
                    "uppers": [upper for _, upper in ranges],
                    "sizes": shard_sizes(users, step, len(ranges)),
                },
            )
            notify(conn, TASKS_CHANNEL, str(unit.id))
        return len(ranges)

    def fence(self, conn: Conn, unit: Unit) -> UUID | None:
        """Lock the unit's row while the claim is still ours; its Cursor, re-read (never
        trusted from memory). In the caller's transaction; LeaseLostError (or
        TaskSupersededError) if the claim is gone."""
        row = conn.execute(_of(unit).lock_cursor, self._fence(unit)).fetchone()
        if row is None:
            raise self.lost_claim(conn, unit)
        cursor: UUID | None = row[0]
        return cursor

    def checkpoint(
        self, conn: Conn, unit: Unit, *, cursor: UUID | None, users: int, last: bool
    ) -> int:
        """Move the Cursor past a written page, extend the lease (the last page completes
        the unit); the unit's ProcessedCount. In the caller's transaction, after `fence`."""
        params = self._fence(unit) | {
            "cursor": cursor,
            "count": users,
            "last": last,
            "lease": self.lease,
        }
        row = conn.execute(_of(unit).checkpoint, params).fetchone()
        if row is None:  # cannot happen under the fence's row lock; kept as a fence
            raise LeaseLostError(unit.id, unit.attempt)
        processed: int = row[0]
        return processed

    def roll_up(self, conn: Conn, unit: Unit) -> Rollup:
        """Roll a shard's task row up from its shards' states, last in the batch's
        transaction (`sql/shards.sql` says why the lock comes first); LeaseLostError if
        the task is gone."""
        locked = conn.execute(_shards.lock_task, {"id": unit.task_id}).fetchone()
        task_status: str = locked[0] if locked else FanOutTaskStatus.FAILED.value
        with conn.cursor(row_factory=class_row(ShardState)) as cur:
            states = cur.execute(_shards.shard_states, {"task_id": unit.task_id}).fetchall()
        rollup = roll_up(task_status, states)
        written = conn.execute(
            _shards.task_rollup,
            {
                "id": unit.task_id,
                "processed": rollup.processed_count,
                "cursor": rollup.cursor,
                "status": rollup.status,
                "attempts": rollup.attempt_count,
                "lease": rollup.lease_expires_at,
                "completed": rollup.completed_now,
            },
        ).rowcount
        if written != 1:  # the task row is locked above and cascades to its shards
            raise LeaseLostError(unit.id, unit.attempt)
        return rollup

    def record_failure(
        self, conn: Conn, unit: Unit, error: str, retry_in: timedelta, *, counted: bool
    ) -> bool:
        """Keep why a batch failed and shorten the lease; an uncounted failure (not the
        unit's own) gives the attempt back. False if the claim was lost."""
        failure = {"error": error[:2000], "retry_in": retry_in, "counted": counted}
        with conn.transaction():
            cur = conn.execute(_of(unit).record_failure, self._fence(unit) | failure)
            return cur.rowcount == 1

    def touch(self, conn: Conn, unit: Unit) -> None:
        """Extend the lease while the walk waits between batches; LeaseLostError (or
        TaskSupersededError) if the claim was lost."""
        with conn.transaction():
            params = self._fence(unit) | {"lease": self.lease}
            if conn.execute(_of(unit).touch, params).rowcount != 1:
                raise self.lost_claim(conn, unit)

    def release(self, conn: Conn, unit: Unit) -> bool:
        """Hand the unit back (graceful stop); False if the claim was no longer ours."""
        with conn.transaction():
            return conn.execute(_of(unit).release, self._fence(unit)).rowcount == 1

    def lost_claim(self, conn: Conn, unit: Unit) -> LeaseLostError:
        """Why a fence failed: a newer version of the role superseded the task, or the lease
        ran out and another worker holds the unit now."""
        row = conn.execute(_tasks.superseded_by, {"id": unit.task_id}).fetchone()
        if row is not None and row[0] is not None:
            return TaskSupersededError(unit.task_id, unit.attempt, row[0])
        return LeaseLostError(unit.id, unit.attempt)

    @staticmethod
    def _fence(unit: Unit) -> dict[str, Any]:
        return {"id": unit.id, "attempt": unit.attempt}


def queue_state(conn: Conn) -> QueueState:
    """The queue's gauges, read from the database (every worker reports them)."""
    row = conn.execute(_tasks.queue_state).fetchone()
    if row is None:  # an aggregate: always one row
        return QueueState(0, 0, 0, 0.0, 0.0)
    backlog, leased, failed, oldest, waiting = row
    return QueueState(backlog, leased, failed, float(oldest or 0), float(waiting))


def task_counts(conn: Conn) -> TaskCounts:
    """The unfinished tasks, each once: waiting or being walked."""
    with conn.cursor(row_factory=class_row(TaskCounts)) as cur:
        row = cur.execute(_tasks.task_counts).fetchone()
    return row or TaskCounts(
        waiting=0, being_walked=0, walked_with_shards_waiting=0, oldest_age_seconds=None
    )


def shard_progress(conn: Conn) -> dict[str, int]:
    """The shards of unfinished tasks by state (`sql/shards.sql` shard_progress)."""
    return dict(conn.execute(_shards.shard_progress).fetchall())


# -- the enqueue side -----------------------------------------------------------------------


def enqueue_task(conn: Conn, role_id: UUID, company_id: UUID | None, version: int) -> UUID:
    """Queue the fan-out of a role's new version and wake the workers on commit (in the
    caller's transaction: the permission change's)."""
    task_id = uuid4()
    conn.execute(
        _tasks.enqueue_task,
        {
            "task_id": task_id,
            "role_id": role_id,
            "company_id": company_id,
            "version": version,
            "reason": AccessChangeReason.ROLE_PERMISSIONS_CHANGED.value,
            "status": FanOutTaskStatus.PENDING.value,
        },
    )
    notify(conn, TASKS_CHANNEL, str(task_id))
    return task_id


def supersede_older_tasks(conn: Conn, role_id: UUID, version: int) -> list[UUID]:
    """Finish the role's tasks older than ``version`` where they stand (in the caller's
    transaction); their ids."""
    params = {"role_id": role_id, "version": version}
    conn.execute(_tasks.supersede_shards, params)
    superseded = [row[0] for row in conn.execute(_tasks.supersede_tasks, params)]
    for task_id in superseded:
        log_event(
            _log,
            "task superseded",
            taskId=str(task_id),
            roleId=str(role_id),
            supersededByVersion=version,
        )
    return superseded


# -- the operator's views -------------------------------------------------------------------


def _select_tasks(filter_: str) -> str:
    return _tasks.compose(
        "select_tasks", columns=columns(FanOutTask), filter=sql.SQL(_tasks[filter_])
    )


_NEWEST: Final = _select_tasks("newest_first")
_UNFINISHED_OF_ROLE: Final = _select_tasks("unfinished_of_role")
_BY_ID: Final = _select_tasks("by_id")
_SHARDS: Final = _shards.compose("select_shards", columns=columns(FanOutShard))


def list_tasks(
    conn: Conn,
    *,
    status: FanOutTaskStatus | None = None,
    role_id: UUID | None = None,
    limit: int = 50,
) -> list[FanOutTask]:
    """Newest first; only ``status`` and only the role ``role_id`` when given."""
    params = {"status": status.value if status else None, "role_id": role_id, "limit": limit}
    with conn.cursor(row_factory=class_row(FanOutTask)) as cur:
        return cur.execute(_NEWEST, params).fetchall()


def unfinished_tasks(conn: Conn, role_id: UUID) -> list[FanOutTask]:
    """The role's tasks not Completed (Failed ones wait for a replay), oldest first."""
    with conn.cursor(row_factory=class_row(FanOutTask)) as cur:
        return cur.execute(_UNFINISHED_OF_ROLE, {"role_id": role_id}).fetchall()


def get_task(conn: Conn, task_id: UUID) -> FanOutTask:
    with conn.cursor(row_factory=class_row(FanOutTask)) as cur:
        task = cur.execute(_BY_ID, {"id": task_id}).fetchone()
    if task is None:
        raise TaskNotFoundError(task_id)
    return task


def list_shards(conn: Conn, task_id: UUID) -> list[FanOutShard]:
    """The shards of a task in range order; empty for a task fanned out as one unit."""
    with conn.cursor(row_factory=class_row(FanOutShard)) as cur:
        return cur.execute(_SHARDS, {"task_id": task_id}).fetchall()


def replay_task(conn: Conn, task_id: UUID) -> FanOutTask:
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
