"""`rewards-membership status`: what an operator asks first, on one screen (or as one JSON
object for scripts): the consumer group's lag on every partition of the topic, in records
and in time, measured at the brokers, and the dead letters waiting for an operator.

Read from Kafka and the database at once, not from the consumers' gauges: it answers when
every consumer is down, when the lag series are gone (the group's committed offsets stay on
the brokers; the records behind them age). Which partitions a running consumer has paused is
its own state (`rewards_membership_paused_partitions`, the RewardsMembershipPartitionPaused
runbook): from outside, a paused partition shows as lag growing while others are consumed.
"""

from __future__ import annotations

import msgspec
import psycopg
from psycopg.rows import TupleRow
from rich.console import Group

from pin_runtime.lag_watch.brokers import open_brokers
from pin_runtime.lag_watch.lag import PartitionLag
from pin_runtime.listing import Columns, Fields, Listing
from rewards_membership.settings import SERVICE_NAME, Settings
from rewards_membership.store import MembershipStore

__all__ = ["ConsumerStatus", "consumer_status", "status_screen"]

_REQUEST_TIMEOUT = 10.0


class ConsumerStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What `rewards-membership status` prints (its `--json` is this, encoded)."""

    group: str
    topic: str
    lag_records: int
    """Records the group has not committed, every partition together."""
    oldest_seconds: float | None
    """Age of the oldest record not committed (None: caught up)."""
    partitions: list[PartitionLag]
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
    return ConsumerStatus(
        group=settings.group_id,
        topic=settings.topic,
        lag_records=sum(p.records for p in partitions),
        oldest_seconds=max(ages, default=None),
        partitions=partitions,
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
    return Group(
        Fields(pairs, title="membership consumer"),
        Listing.of(status.partitions, _PARTITION_COLUMNS, title="partitions"),
    )
