"""The lag of a consumer group on a partition, and what the gauges show between passes.

Pure: no client, no clock of its own. The watcher reads offsets and timestamps, builds a
`Reading` per position and hands it to the `LagBook`, which decides what each series shows:

- **Records**: the high watermark minus the committed offset; a partition the group never
  committed counts from its low watermark (the group would start there).
- **Seconds**: now minus the timestamp of the oldest record the group has not consumed (the
  first record at or after its committed offset); 0 when the group is caught up, so an
  alert on it resolves as soon as the group catches up, without waiting for new traffic.
- **Between passes, and when a read fails**: a position not read again keeps its record lag
  and its seconds lag keeps growing from the same oldest record (a group that was behind is
  taken to be still behind; one that was caught up stays at 0), for `stale_after` seconds
  since its last successful read. Then its series are dropped. A broker outage therefore
  neither resolves a lag alert that fires nor raises one from nothing, and the watcher's own
  alert (its last success growing old) says that the series are no longer fresh.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

import msgspec

__all__ = [
    "LagBook",
    "PartitionLag",
    "Position",
    "Reading",
    "Series",
    "oldest_offset",
    "records_lag",
]


class Position(msgspec.Struct, frozen=True, order=True):
    """One series: a consumer group on one partition of a topic."""

    group: str
    topic: str
    partition: int


def oldest_offset(*, low: int, committed: int | None) -> int:
    """Where the group's oldest unconsumed record is: its committed offset, or the low
    watermark when it never committed on the partition (or its offset was deleted)."""
    if committed is None or committed < 0:
        return max(low, 0)
    return committed


def records_lag(*, low: int, high: int, committed: int | None) -> int:
    """Records of the partition the group has not consumed (kafka_exporter's lag)."""
    return max(0, high - oldest_offset(low=low, committed=committed))


class PartitionLag(msgspec.Struct, frozen=True, kw_only=True):
    """One group's lag on one partition, read once (a service's `status` command)."""

    topic: str
    partition: int
    committed: int | None
    """The group's committed offset (None: it never committed here)."""
    high: int
    records: int
    seconds: float | None
    """Age of the oldest unconsumed record (None: caught up, or its timestamp not read)."""
    metadata: str | None = None
    """What the group committed beside its offset (Kafka's offset commit metadata), if
    anything: a consumer's own note on the partition, such as why it paused it."""


class Reading(msgspec.Struct, frozen=True):
    """What one pass read for a position."""

    records: int
    start: int
    """The offset the oldest unconsumed record is looked for at (`oldest_offset`)."""
    oldest: float | None
    """Unix time (s) of that record; None when the group is caught up (nothing to age)."""


class Series(msgspec.Struct, frozen=True):
    """What the gauges show for a position now."""

    position: Position
    records: int
    seconds: float


@dataclass
class _Entry:
    reading: Reading
    read_at: float  # the watcher's monotonic clock


class LagBook:
    """The last reading of every watched position, aged and dropped as the module says.

    Bounded by the positions watched: the watcher caps the groups, a topic's partitions are
    the broker's, and every entry leaves after `stale_after` without a read.
    """

    def __init__(self, *, stale_after: float) -> None:
        if stale_after <= 0:
            raise ValueError(f"stale_after must be > 0, got {stale_after}")
        self.stale_after = stale_after
        self._entries: dict[Position, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def known_oldest(self, position: Position, start: int) -> float | None:
        """The timestamp read before for the same record, if any: the record at an offset
        never changes, so a group that has not moved costs no read."""
        entry = self._entries.get(position)
        if entry is None or entry.reading.start != start:
            return None
        return entry.reading.oldest

    def update(self, position: Position, reading: Reading, *, at: float) -> None:
        if reading.records > 0 and reading.oldest is None:
            raise ValueError(f"{position}: a lag of {reading.records} records needs its oldest")
        self._entries[position] = _Entry(reading, at)

    def retire(self, watched: Collection[tuple[str, str]]) -> list[Position]:
        """Drop the positions of every (group, topic) no longer watched; the dropped ones."""
        gone = [p for p in self._entries if (p.group, p.topic) not in watched]
        for position in gone:
            del self._entries[position]
        return gone

    def series(self, *, now: float, at: float) -> Iterator[Series]:
        """Every position's series at Unix time `now` (monotonic `at`); positions without a
        read for `stale_after` are dropped first."""
        for position in [p for p, e in self._entries.items() if at - e.read_at > self.stale_after]:
            del self._entries[position]
        for position, entry in sorted(self._entries.items()):
            reading = entry.reading
            seconds = 0.0 if reading.oldest is None else max(0.0, now - reading.oldest)
            yield Series(position, reading.records, seconds)
