"""`rewards-membership status`: what an operator asks first, on one screen (or as one JSON
object for scripts): the consumer group's lag on every partition of the topic, in records
and in time, measured at the brokers, the partitions a consumer paused (why, since when,
the next retry), and the dead letters waiting for an operator.

Read from Kafka and the database at once, not from the consumers' gauges: it answers when
every consumer is down, when the lag series are gone (the group's committed offsets stay on
the brokers; the records behind them age). A consumer that pauses a partition commits its
position again with a note of the pause as the offset's metadata (`consumer.partitions.
PauseNote`), read here with the offsets; the partition's next successful commit clears it.
A note whose retry is long past names a consumer that stopped while the partition was
paused (or a partition taken over and not yet committed by its new owner).
"""

from __future__ import annotations

import time

import msgspec
import psycopg
from psycopg.rows import TupleRow
from rich.console import Console, Group

from pin_runtime.lag_watch.brokers import open_brokers
from pin_runtime.lag_watch.lag import PartitionLag
from pin_runtime.listing import Columns, Fields, Listing
from rewards_membership.consumer.partitions import pause_note_of
from rewards_membership.ops.tool import connect_tool, write_json
from rewards_membership.settings import SERVICE_NAME, Settings
from rewards_membership.store import MembershipStore

__all__ = ["ConsumerStatus", "PausedPartition", "consumer_status", "show_status", "status_screen"]

_REQUEST_TIMEOUT = 10.0


class PausedPartition(msgspec.Struct, frozen=True, kw_only=True):
    """A partition a consumer paused, as its note on the brokers says."""

    partition: int
    dependency: str
    """What failed: postgresql, kafka (the DLQ)."""
    cause: str
    """Why it waits: `lock_timeout` (a row of it locked elsewhere: the database answers,
    the other partitions go on), else the dependency, unavailable."""
    reason: str
    paused_seconds: float
    """How long it has been paused, now."""
    retry_in_seconds: float
    """Seconds to its next retry (negative: overdue, its consumer is likely gone)."""
    attempts: int
    host: str


class ConsumerStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What `rewards-membership status` prints (its `--json` is this, encoded)."""

    group: str
    topic: str
    lag_records: int
    """Records the group has not committed, every partition together."""
    oldest_seconds: float | None
    """Age of the oldest record not committed (None: caught up)."""
    partitions: list[PartitionLag]
    paused: list[PausedPartition]
    dead_letters_pending: int
    """Dead-lettered records neither replayed nor resolved (`dlq list`)."""
    dlq_topic: str


def consumer_status(settings: Settings, conn: psycopg.Connection[TupleRow]) -> ConsumerStatus:
    with open_brokers(
        settings.kafka_bootstrap,
        client_id=f"{SERVICE_NAME}-status",
        security=settings.kafka_security(),
        timeout=_REQUEST_TIMEOUT,
    ) as brokers:
        partitions = brokers.lag_of(settings.group_id, settings.topic)
    ages = [p.seconds for p in partitions if p.seconds is not None]
    now = time.time()
    paused = [
        PausedPartition(
            partition=p.partition,
            dependency=note.paused,
            cause=note.cause or note.paused,
            reason=note.reason,
            paused_seconds=round(max(0.0, now - note.since), 1),
            retry_in_seconds=round(note.retry_at - now, 1),
            attempts=note.attempts,
            host=note.host,
        )
        for p in partitions
        if (note := pause_note_of(p.metadata)) is not None
    ]
    return ConsumerStatus(
        group=settings.group_id,
        topic=settings.topic,
        lag_records=sum(p.records for p in partitions),
        oldest_seconds=max(ages, default=None),
        partitions=partitions,
        paused=paused,
        dead_letters_pending=MembershipStore.count_unreplayed(conn),
        dlq_topic=settings.dlq_topic,
    )


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


_PARTITION_COLUMNS: Columns[PartitionLag] = {
    "partition": lambda p: str(p.partition),
    "committed": lambda p: "-" if p.committed is None else str(p.committed),
    "end": lambda p: str(p.high),
    "lag (records)": lambda p: str(p.records),
    "oldest waiting": lambda p: _age(p.seconds),
}


_PAUSED_COLUMNS: Columns[PausedPartition] = {
    "partition": lambda p: str(p.partition),
    "dependency": lambda p: p.dependency,
    "cause": lambda p: p.cause,
    "paused for": lambda p: _age(p.paused_seconds),
    "next retry": lambda p: (
        f"in {p.retry_in_seconds:.1f}s"
        if p.retry_in_seconds >= 0
        else f"overdue by {-p.retry_in_seconds:.1f}s"
    ),
    "attempts": lambda p: str(p.attempts),
    "host": lambda p: p.host,
    "reason": lambda p: p.reason,
}


def status_screen(status: ConsumerStatus) -> Group:
    pairs = [
        ("group", status.group),
        ("topic", status.topic),
        ("lag", f"{status.lag_records} record(s), the oldest {_age(status.oldest_seconds)}"),
        (
            "dead letters pending",
            f"{status.dead_letters_pending} on {status.dlq_topic}"
            + (" (dlq list)" if status.dead_letters_pending else ""),
        ),
    ]
    pairs.insert(
        3,
        (
            "paused partitions",
            ", ".join(str(p.partition) for p in status.paused) if status.paused else "none",
        ),
    )
    parts: list[Fields | Listing] = [
        Fields(pairs, title="membership consumer"),
        Listing.of(status.partitions, _PARTITION_COLUMNS, title="partitions"),
    ]
    if status.paused:
        parts.append(Listing.of(status.paused, _PAUSED_COLUMNS, title="paused partitions"))
    return Group(*parts)


def show_status(settings: Settings, *, as_json: bool = False) -> int:
    """The screen, or with `--json` the one `ConsumerStatus` document on stdout."""
    with connect_tool(settings) as conn:
        shown = consumer_status(settings, conn)
    if as_json:
        write_json(shown)
    else:
        Console().print(status_screen(shown))
    return 0
