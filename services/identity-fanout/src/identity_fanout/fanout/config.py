"""The fan-out worker's own settings."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

__all__ = ["DEFAULT_MAX_OUTBOX_BACKLOG", "DEFAULT_SHARD_SIZE", "WorkerConfig"]

DEFAULT_SHARD_SIZE = 25_000
"""Users per shard of a large task (ShardSize)."""
DEFAULT_MAX_OUTBOX_BACKLOG = 10_000
"""Unpublished outbox rows at which the fan-out waits for the relays (MaxOutboxBacklog)."""


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """The parts of Settings the worker loop and its unit runner use, as plain values
    (tests build them directly)."""

    batch_size: int
    polling_interval: timedelta
    max_lease_duration: timedelta
    max_attempts: int
    shard_size: int = DEFAULT_SHARD_SIZE
    max_outbox_backlog: int = DEFAULT_MAX_OUTBOX_BACKLOG
