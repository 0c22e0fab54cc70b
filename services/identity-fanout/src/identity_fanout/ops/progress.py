"""How far a fan-out task (and each of its shards) has come: total, done, percentage, rate
and ETA, decided from the rows alone (pure; `tasks show`, `tasks show --watch`, `roles
show`).

The total is the users the worker counted when it first claimed the task (a sharded task:
the count it was split by; a shard: the users between its bounds at the split), so it is
unknown (None) until a worker claimed the task. Users assigned to the role later are still
reached, so ProcessedCount can pass the total: the percentage stops at 100 until the unit
is Completed.

The rate is over the unit's life: users processed divided by the seconds from its first
claim (StartedAt) to its completion, or to now while it runs. A watch shows the rate over
its recent samples instead (`ops.watch`); one look has only the rows.

A task that cannot move has no ETA but the reason (`blocked`, decided by `blocked_reason`
from what the database shows): no live worker, the fan-out throttled at the outbox bound, or
every unit in progress held by a lease that has expired (its worker gone or cut off from the
database). An ETA at the life rate would be finite and false then.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final, NamedTuple

import msgspec

from identity_fanout.fanout.queue import FanOutShard, FanOutTask, LeasedRow
from pin_contracts import FanOutTaskStatus

__all__ = [
    "RATE_BASIS",
    "Progress",
    "ShardProgress",
    "TaskProgress",
    "blocked_reason",
    "task_progress",
]

RATE_BASIS: Final = "life"
"""What `rate_per_second` is measured over: the unit's life (StartedAt to now or to
CompletedAt), told in the JSON so a script does not have to guess."""


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """One unit's progress: a task's or a shard's."""

    status: str
    total: int | None
    """Users to reach (None: not counted yet, or counted by an older worker)."""
    done: int
    """Users reached: ProcessedCount."""
    percent: float | None
    rate_per_second: float | None
    """Users a second over the unit's life (None: not started, or no time has passed)."""
    eta_seconds: float | None
    """Seconds left at that rate (0 once Completed; None: unknown total or no rate, the
    unit is Failed and waits for a replay, or the task is `blocked`)."""
    rate_basis: str = RATE_BASIS
    blocked: str | None = None
    """Why the task cannot move now (`blocked_reason`); None: it can, or it has ended."""


class ShardProgress(Progress, frozen=True, kw_only=True):
    shard_no: int


class TaskProgress(Progress, frozen=True, kw_only=True):
    task_id: str
    shards: tuple[ShardProgress, ...] = ()
    """One per shard, in range order (none: the task is walked as one unit)."""


def task_progress(
    task: FanOutTask, shards: Sequence[FanOutShard], now: datetime, *, blocked: str | None = None
) -> TaskProgress:
    """The task's progress and each shard's, as of ``now``; ``blocked``: why it cannot move
    (no ETA then, for the task or its shards)."""
    total = task.user_count
    if total is None and shards and all(s.user_count is not None for s in shards):
        total = sum(s.user_count or 0 for s in shards)
    if task.status in _ENDED:
        blocked = None
    measured = _measure(task, total, now)
    return TaskProgress(
        task_id=str(task.id),
        status=task.status,
        total=total,
        done=task.processed_count,
        percent=measured.percent,
        rate_per_second=measured.rate,
        eta_seconds=None if blocked else measured.eta,
        blocked=blocked,
        shards=tuple(_shard(s, now, blocked) for s in shards),
    )


_ENDED: Final = frozenset({FanOutTaskStatus.COMPLETED.value, FanOutTaskStatus.FAILED.value})


def blocked_reason(
    task: FanOutTask,
    shards: Sequence[FanOutShard],
    now: datetime,
    *,
    live_workers: int,
    outbox_rows: int,
    max_outbox_backlog: int,
) -> str | None:
    """Why ``task`` cannot move now, or None: no live worker, the fan-out throttled at the
    outbox bound (MAX_OUTBOX_BACKLOG: the workers hold their next batch until the relays
    publish), or every unit in progress on an expired lease (its worker gone, or cut off
    from the database: another claims it once a worker looks)."""
    if task.status in _ENDED:
        return None
    if live_workers == 0:
        return "no worker: no worker process is connected to the database"
    if outbox_rows >= max_outbox_backlog:
        return (
            f"throttled: {outbox_rows} outbox row(s) wait for the relays, at or above the "
            f"bound of {max_outbox_backlog} (MAX_OUTBOX_BACKLOG)"
        )
    units: Sequence[LeasedRow] = shards or [task]
    leased = [u for u in units if u.status == FanOutTaskStatus.IN_PROGRESS.value]
    expired = [u for u in leased if u.lease_expires_at is not None and u.lease_expires_at < now]
    if leased and len(expired) == len(leased):
        since = min(u.lease_expires_at for u in expired if u.lease_expires_at is not None)
        return f"stalled: the lease of its unit(s) in progress expired at {since.isoformat()}"
    return None


def _shard(shard: FanOutShard, now: datetime, blocked: str | None) -> ShardProgress:
    measured = _measure(shard, shard.user_count, now)
    return ShardProgress(
        shard_no=shard.shard_no,
        status=shard.status,
        total=shard.user_count,
        done=shard.processed_count,
        percent=measured.percent,
        rate_per_second=measured.rate,
        eta_seconds=None if blocked and shard.status not in _ENDED else measured.eta,
    )


class _Measured(NamedTuple):
    percent: float | None
    rate: float | None
    eta: float | None


def _measure(row: LeasedRow, total: int | None, now: datetime) -> _Measured:
    completed = row.status == FanOutTaskStatus.COMPLETED.value
    done = row.processed_count
    percent = None
    if completed:
        percent = 100.0
    elif total is not None:
        percent = 100.0 if total == 0 else min(100.0, round(100.0 * done / total, 1))
    rate = _rate(row, now)
    eta: float | None = None
    if completed:
        eta = 0.0
    elif row.status != FanOutTaskStatus.FAILED.value and total is not None and rate:
        eta = round(max(0, total - done) / rate, 1)
    return _Measured(percent, None if rate is None else round(rate, 1), eta)


def _rate(row: LeasedRow, now: datetime) -> float | None:
    if row.started_at is None:
        return None
    end = row.completed_at or now
    seconds = (end - row.started_at).total_seconds()
    if seconds <= 0:
        return None
    return row.processed_count / seconds
