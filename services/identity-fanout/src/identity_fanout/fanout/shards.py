"""Shards of a large fan-out task: the pure decisions (how many, which ranges, roll-up).

A role with more users than ShardSize is split into about equal, disjoint UserId ranges
(lower bound exclusive, upper bound inclusive, the last one open-ended so a user added after
the split is still covered). The bounds come from the data (every step-th of the role's
user ids in order), so each shard holds about ShardSize users whatever the distribution
of the ids.

The task row stays what operators see, rolled up from its shards after every shard batch:
ProcessedCount is the sum; Cursor is the low watermark (every user at or below it has its
event: the cursor, or the lower bound, of the first unfinished shard; the last shard's cursor
once all are done); AttemptCount is the highest of the shards' (the shard closest to
poison); LeaseExpiresAt the latest live lease of a shard (none while no shard is leased);
the task is Completed when its last shard completes, never while one is Failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final
from uuid import UUID

import msgspec

from pin_contracts import FanOutTaskStatus

# Below every real UserId (the schema forbids the nil UUID): shard 1's lower bound.
START: Final = UUID(int=0)
# The largest UUID: the upper bound of a task walked as one unit (and of the last shard).
END: Final = UUID(int=(1 << 128) - 1)


class ShardState(msgspec.Struct, frozen=True, kw_only=True):
    """What the roll-up reads of each shard."""

    shard_no: int
    status: str
    lower_bound: UUID
    cursor: UUID | None
    processed_count: int
    attempt_count: int = 0
    lease_expires_at: datetime | None = None


class Rollup(msgspec.Struct, frozen=True, kw_only=True):
    """The task row's Status, ProcessedCount and Cursor derived from its shards."""

    status: str
    processed_count: int
    cursor: UUID | None
    attempt_count: int
    lease_expires_at: datetime | None
    completed_now: bool
    """This roll-up is the one that completes the task: metrics and the log happen once."""


def shard_count_for(users: int, shard_size: int) -> int:
    """Shards for a role of ``users`` users; 0 keeps the task one unit (no shard rows)."""
    if shard_size < 1:
        raise ValueError("shard_size must be positive")
    if users <= shard_size:
        return 0
    return -(-users // shard_size)


def split_step(users: int, shards: int) -> int:
    """Users per shard: the inner bounds are every step-th user, the last shard the rest."""
    if shards < 1:
        raise ValueError("shards must be positive")
    return max(1, -(-users // shards))


def shard_sizes(users: int, step: int, shards: int) -> list[int]:
    """The users of each shard at the split: ``step`` each (its upper bound is the step-th
    user after its lower one), the last the rest. Exact unless the role changed between the
    count and the bounds (then about right: a total for progress, never a limit)."""
    if shards < 1:
        return []
    sizes = [step] * (shards - 1)
    return [*sizes, max(0, users - step * (shards - 1))]


def shard_ranges(bounds: Sequence[UUID]) -> list[tuple[UUID, UUID | None]]:
    """(lower exclusive, upper inclusive) per shard from the inner bounds, ascending.

    Repeated or out-of-order bounds (a role that shrank between the count and the
    bounds query) are dropped rather than making an empty or overlapping range.
    """
    inner: list[UUID] = []
    for bound in bounds:
        if bound > (inner[-1] if inner else START):
            inner.append(bound)
    lowers = [START, *inner]
    uppers: list[UUID | None] = [*inner, None]
    return list(zip(lowers, uppers, strict=True))


def roll_up(task_status: str, shards: Sequence[ShardState]) -> Rollup:
    """The task row after a shard batch: sum, low watermark, and completion once."""
    ordered = sorted(shards, key=lambda s: s.shard_no)
    processed = sum(s.processed_count for s in ordered)
    unfinished = [s for s in ordered if s.status != FanOutTaskStatus.COMPLETED.value]
    if unfinished:
        first = unfinished[0]
        mark = first.cursor or first.lower_bound
        cursor = None if mark == START else mark
    else:
        cursor = max((s.cursor for s in ordered if s.cursor is not None), default=None)
    completes = (
        bool(ordered) and not unfinished and task_status == FanOutTaskStatus.IN_PROGRESS.value
    )
    leases = [
        s.lease_expires_at
        for s in ordered
        if s.status == FanOutTaskStatus.IN_PROGRESS.value and s.lease_expires_at is not None
    ]
    return Rollup(
        status=FanOutTaskStatus.COMPLETED.value if completes else task_status,
        processed_count=processed,
        cursor=cursor,
        attempt_count=max((s.attempt_count for s in ordered), default=0),
        lease_expires_at=None if completes or not leases else max(leases),
        completed_now=completes,
    )
