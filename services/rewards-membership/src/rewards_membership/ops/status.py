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

With Kafka or the database down it shows what the other one answers, the missing part as
unavailable (`-` on the screen, `null` in JSON, the reason under `unavailable`), one line on
stderr saying what it could not reach, and exits 1 (docs/design/rewards-membership.md
"When a dependency is down").
"""

from __future__ import annotations

import time

import msgspec
import psycopg
from confluent_kafka import KafkaException
from psycopg.rows import TupleRow
from rich.console import Console, Group

from pin_runtime.lag_watch.brokers import BrokerReadError
from pin_runtime.lag_watch.lag import PartitionLag
from pin_runtime.listing import Columns, Fields, Listing
from rewards_membership.consumer.partitions import pause_note_of
from rewards_membership.ops.brokers import ToolKafka
from rewards_membership.ops.tool import (
    MISSING,
    connect_tool,
    database_unavailable,
    say_unavailable,
    write_json,
)
from rewards_membership.settings import Settings
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
    lag_records: int | None
    """Records the group has not committed, every partition together (None: Kafka
    unavailable)."""
    oldest_seconds: float | None
    """Age of the oldest record not committed (None: caught up, or Kafka unavailable)."""
    partitions: list[PartitionLag] | None
    """None: Kafka unavailable."""
    paused: list[PausedPartition] | None
    """None: Kafka unavailable (the notes are on the brokers)."""
    dead_letters_pending: int | None
    """Dead-lettered records neither replayed nor resolved (`dlq list`); None: the
    database unavailable."""
    dlq_topic: str
    unavailable: dict[str, str] = msgspec.field(default_factory=dict)
    """What could not be reached (`kafka`, `postgresql`) and why; empty when all answered."""


def consumer_status(
    settings: Settings, conn: psycopg.Connection[TupleRow], kafka: ToolKafka | None = None
) -> ConsumerStatus:
    """Both parts, read now; a failed read of either raises."""
    partitions = _lag(settings, kafka or ToolKafka(settings, "status"))
    return _status(settings, partitions, MembershipStore.count_unreplayed(conn), {})


def _lag(settings: Settings, kafka: ToolKafka) -> list[PartitionLag]:
    with kafka.brokers(timeout=_REQUEST_TIMEOUT) as brokers:
        return brokers.lag_of(settings.group_id, settings.topic)


def _status(
    settings: Settings,
    partitions: list[PartitionLag] | None,
    pending: int | None,
    unavailable: dict[str, str],
) -> ConsumerStatus:
    if partitions is None:
        return ConsumerStatus(
            group=settings.group_id,
            topic=settings.topic,
            lag_records=None,
            oldest_seconds=None,
            partitions=None,
            paused=None,
            dead_letters_pending=pending,
            dlq_topic=settings.dlq_topic,
            unavailable=unavailable,
        )
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
        dead_letters_pending=pending,
        dlq_topic=settings.dlq_topic,
        unavailable=unavailable,
    )


def _age(seconds: float | None) -> str:
    return MISSING if seconds is None else f"{seconds:.1f}s"


_PARTITION_COLUMNS: Columns[PartitionLag] = {
    "partition": lambda p: str(p.partition),
    "committed": lambda p: MISSING if p.committed is None else str(p.committed),
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


def _unavailable(dependency: str) -> str:
    return f"{MISSING} ({dependency} unavailable)"


def status_screen(status: ConsumerStatus) -> Group:
    if status.lag_records is None:
        lag = paused = _unavailable("kafka")
    else:
        lag = f"{status.lag_records} record(s), the oldest {_age(status.oldest_seconds)}"
        paused = ", ".join(str(p.partition) for p in status.paused or ()) or "none"
    pending = (
        _unavailable("database")
        if status.dead_letters_pending is None
        else f"{status.dead_letters_pending} on {status.dlq_topic}"
        + (" (dlq list)" if status.dead_letters_pending else "")
    )
    pairs = [
        ("group", status.group),
        ("topic", status.topic),
        ("lag", lag),
        ("paused partitions", paused),
        ("dead letters pending", pending),
    ]
    parts: list[Fields | Listing] = [Fields(pairs, title="membership consumer")]
    if status.partitions is not None:
        parts.append(Listing.of(status.partitions, _PARTITION_COLUMNS, title="partitions"))
    if status.paused:
        parts.append(Listing.of(status.paused, _PAUSED_COLUMNS, title="paused partitions"))
    return Group(*parts)


def show_status(settings: Settings, *, as_json: bool = False) -> int:
    """The screen, or with `--json` the one `ConsumerStatus` document on stdout; exit 1 with
    one line on stderr when Kafka or the database could not be read (the other's part is
    shown all the same)."""
    unavailable: dict[str, str] = {}
    pending = None
    try:
        with connect_tool(settings) as conn:
            pending = MembershipStore.count_unreplayed(conn)
    except psycopg.OperationalError as exc:
        why = database_unavailable(exc)
        if why is None:
            raise
        unavailable["postgresql"] = why
    kafka = ToolKafka(settings, "status")
    partitions = None
    why = kafka.reach()
    if why is None:
        try:
            partitions = _lag(settings, kafka)
        except (BrokerReadError, KafkaException) as exc:
            why = kafka.failure(exc)
    if why is not None:
        unavailable["kafka"] = why
    shown = _status(settings, partitions, pending, unavailable)
    if as_json:
        write_json(shown)
    else:
        Console().print(status_screen(shown))
    return say_unavailable(unavailable)
