"""The queue as `identity-fanout tasks list/show` shows it: tasks, one task, its shards."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final
from uuid import UUID

from identity_fanout.fanout.queue import FanOutShard, FanOutTask
from identity_fanout.fanout.shards import START
from pin_runtime.listing import Columns, Fields, Listing, timestamp_cell

__all__ = ["shards_table", "task_detail", "tasks_table"]

_TASK_COLUMNS: Final[Columns[FanOutTask]] = {
    "id": lambda t: str(t.id),
    "role": lambda t: str(t.role_id),
    "version": lambda t: str(t.role_version),
    "status": lambda t: t.status,
    "processed": lambda t: str(t.processed_count),
    "shards": lambda t: str(t.shard_count or "-"),
    "attempts": lambda t: str(t.attempt_count),
    "created": lambda t: timestamp_cell(t.created_at),
    "lease until": lambda t: timestamp_cell(t.lease_expires_at),
    "last error": lambda t: (t.last_error or "")[:80],
}


def tasks_table(tasks: Sequence[FanOutTask]) -> Listing:
    return Listing.of(tasks, _TASK_COLUMNS, title="access fan-out tasks")


def task_detail(task: FanOutTask) -> Fields:
    return Fields(
        ((name, _shown(getattr(task, name))) for name in FanOutTask.__struct_fields__),
        title=f"task {task.id}",
    )


def _shown(value: object) -> str:
    return timestamp_cell(value) if isinstance(value, datetime) else str(value)


def _bound(value: UUID | None, open_end: str) -> str:
    return open_end if value is None or value == START else str(value)


_SHARD_COLUMNS: Final[Columns[FanOutShard]] = {
    "no": lambda s: str(s.shard_no),
    "after": lambda s: _bound(s.lower_bound, "start"),
    "up to": lambda s: _bound(s.upper_bound, "end"),
    "status": lambda s: s.status,
    "processed": lambda s: str(s.processed_count),
    "cursor": lambda s: str(s.cursor) if s.cursor else "-",
    "attempts": lambda s: str(s.attempt_count),
    "lease until": lambda s: timestamp_cell(s.lease_expires_at),
    "last error": lambda s: (s.last_error or "")[:80],
}


def shards_table(shards: Sequence[FanOutShard]) -> Listing:
    """One row per shard: its UserId range (lower exclusive, upper inclusive) and progress."""
    return Listing.of(shards, _SHARD_COLUMNS, title="shards")
