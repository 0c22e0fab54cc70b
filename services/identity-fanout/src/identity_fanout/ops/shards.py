"""The shard table of `tasks show` for a task fanned out in shards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final
from uuid import UUID

from identity_fanout.fanout.shards import START, FanOutShard
from pin_runtime.listing import Columns, Listing, timestamp_cell


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
