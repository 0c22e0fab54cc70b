"""The queue as `identity-fanout tasks list/show` shows it: tasks, one task with its
progress, its shards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final
from uuid import UUID

import msgspec

from identity_fanout.fanout.queue import FanOutShard, FanOutTask
from identity_fanout.fanout.shards import START
from identity_fanout.ops.cells import NULL, cell, duration_cell, percent_cell, rate_cell
from identity_fanout.ops.progress import Progress, ShardProgress, TaskProgress
from pin_runtime.listing import Columns, Fields, Listing

__all__ = ["TaskView", "shards_table", "task_detail", "tasks_table"]

_TASK_COLUMNS: Final[Columns[FanOutTask]] = {
    "id": lambda t: str(t.id),
    "role": lambda t: cell(t.role_code),
    "role id": lambda t: str(t.role_id),
    "version": lambda t: str(t.role_version),
    "status": lambda t: t.status,
    "processed": lambda t: str(t.processed_count),
    "users": lambda t: cell(t.user_count),
    "shards": lambda t: str(t.shard_count) if t.shard_count else NULL,
    "attempts": lambda t: str(t.attempt_count),
    "created": lambda t: cell(t.created_at),
    "lease until": lambda t: cell(t.lease_expires_at),
    "last error": lambda t: cell(t.last_error, width=80),
}


def tasks_table(tasks: Sequence[FanOutTask], *, title: str = "access fan-out tasks") -> Listing:
    return Listing.of(tasks, _TASK_COLUMNS, title=title)


class TaskView(msgspec.Struct, frozen=True, kw_only=True):
    """What `tasks show --json` prints: the task, its shards, and how far each has come."""

    task: FanOutTask
    shards: tuple[FanOutShard, ...]
    progress: TaskProgress


def _progress_pairs(progress: Progress) -> list[tuple[str, str]]:
    total = cell(progress.total)
    return [
        ("progress", f"{progress.done} of {total} user(s), {percent_cell(progress.percent)}"),
        ("rate", f"{rate_cell(progress.rate_per_second)} (over its life: since its first claim)"),
        (
            "eta",
            f"none, {progress.blocked}"
            if progress.blocked
            else duration_cell(progress.eta_seconds),
        ),
    ]


def task_detail(view: TaskView) -> Fields:
    """Every field of the task, then its progress: total, done, percentage, rate, ETA."""
    task = view.task
    pairs = [(name, cell(getattr(task, name))) for name in FanOutTask.__struct_fields__]
    return Fields([*pairs, *_progress_pairs(view.progress)], title=f"task {task.id}")


def _bound(value: UUID | None, open_end: str) -> str:
    return open_end if value is None or value == START else str(value)


def _shard_columns(progress: dict[int, ShardProgress]) -> Columns[FanOutShard]:
    def of(shard: FanOutShard) -> ShardProgress | None:
        return progress.get(shard.shard_no)

    return {
        "no": lambda s: str(s.shard_no),
        "after": lambda s: _bound(s.lower_bound, "start"),
        "up to": lambda s: _bound(s.upper_bound, "end"),
        "status": lambda s: s.status,
        "processed": lambda s: str(s.processed_count),
        "users": lambda s: cell(s.user_count),
        "done": lambda s: percent_cell(p.percent) if (p := of(s)) else NULL,
        "rate": lambda s: rate_cell(p.rate_per_second) if (p := of(s)) else NULL,
        "eta": lambda s: duration_cell(p.eta_seconds) if (p := of(s)) else NULL,
        "cursor": lambda s: cell(s.cursor),
        "attempts": lambda s: str(s.attempt_count),
        "lease until": lambda s: cell(s.lease_expires_at),
        "last error": lambda s: cell(s.last_error, width=80),
    }


def shards_table(shards: Sequence[FanOutShard], progress: Sequence[ShardProgress] = ()) -> Listing:
    """One row per shard: its UserId range (lower exclusive, upper inclusive) and progress."""
    by_no = {p.shard_no: p for p in progress}
    return Listing.of(shards, _shard_columns(by_no), title="shards")
