"""The AccessFanOutTask row, as the worker and the runbook CLI see it, and the columns it
shares with a shard row."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import msgspec


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
