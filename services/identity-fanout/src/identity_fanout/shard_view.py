"""The shard table of `tasks show` for a task fanned out in shards."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from identity_fanout.shards import START, FanOutShard
from pin_runtime.listing import Listing, timestamp_cell


def _bound(value: UUID | None, open_end: str) -> str:
    return open_end if value is None or value == START else str(value)


def shards_table(shards: Sequence[FanOutShard]) -> Listing:
    """One row per shard: its UserId range (lower exclusive, upper inclusive) and progress."""
    columns = (
        "no",
        "after",
        "up to",
        "status",
        "processed",
        "cursor",
        "attempts",
        "lease until",
        "last error",
    )
    rows = [
        (
            str(s.shard_no),
            _bound(s.lower_bound, "start"),
            _bound(s.upper_bound, "end"),
            s.status,
            str(s.processed_count),
            str(s.cursor) if s.cursor else "-",
            str(s.attempt_count),
            timestamp_cell(s.lease_expires_at),
            (s.last_error or "")[:80],
        )
        for s in shards
    ]
    return Listing(columns, rows, title="shards")
