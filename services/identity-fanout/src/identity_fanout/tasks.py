"""The AccessFanOutTask row, as the worker and the runbook CLI see it."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import msgspec


class FanOutTask(msgspec.Struct, frozen=True, kw_only=True):
    """One row of identity.access_fanout_tasks (spec: AccessFanOutTask)."""

    id: UUID
    role_id: UUID
    company_id: UUID | None
    role_version: int
    reason: str
    status: str
    cursor: UUID | None
    processed_count: int
    attempt_count: int
    lease_expires_at: datetime | None
    last_error: str | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    updated_at: datetime
    shard_count: int = 0
    """0: one unit; otherwise the number of shards the task was split into."""
