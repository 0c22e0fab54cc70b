"""Rebalance callbacks around the batch in flight and the records polled meanwhile.

Served inside `consume()`, on the poll thread, doing there only what the protocol needs
before the call returns. A revocation first finishes the batch in flight (its transaction,
dead letters and commit: its report waits for the loop), so the next owner starts exactly
after what was applied; a loss commits nothing of the lost partitions, so nothing waits for
the batch: the loop finishes it after the poll without them (`lost`). Either way the
partitions' state is forgotten at once (offsets, pauses, kept outcomes, DLQ receipts, lag).
The partitions revoked or lost during a poll are remembered until the poll returns: records
it returned for them are dropped (never applied or committed here), and a partition
assigned back within the same poll is sought back to the first dropped record.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import KW_ONLY, dataclass, field

from confluent_kafka import Consumer, Message, TopicPartition

from pin_runtime.http import ComponentState
from pin_runtime.logging import log_event
from rewards_membership.consumer.batch import Batches
from rewards_membership.consumer.lag import LagReporter
from rewards_membership.consumer.partitions import PartitionControl, seek_back
from rewards_membership.records import offset_of, partition_of

__all__ = ["RebalanceGuard", "reseek_offsets"]

_log = logging.getLogger(__name__)


@dataclass(eq=False)
class RebalanceGuard:
    consumer: Consumer
    _: KW_ONLY
    topic: str
    partitions: PartitionControl
    batches: Batches
    lag: LagReporter
    kafka_state: ComponentState
    """Ok again once partitions are assigned: the group answers."""
    lost: set[int] = field(init=False, default_factory=set)
    """Partitions lost during the current poll: the batch in flight is finished without
    them (after the poll), even if they were assigned back meanwhile."""
    _touched: set[int] = field(init=False, default_factory=set)

    def poll_started(self) -> None:
        self._touched.clear()
        self.lost.clear()

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.partitions.on_assign(consumer, partitions)
        self.kafka_state.ok()
        self.lag.soon()

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        self._touched.update(numbers)
        self.batches.finish(self.lost)
        self.partitions.on_revoke(consumer, partitions)
        self._forget(numbers)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Lost: another member may own them already; nothing of them is committed here.
        numbers = [tp.partition for tp in partitions]
        self._touched.update(numbers)
        self.lost.update(numbers)
        self.partitions.on_lost(consumer, partitions)
        self._forget(numbers)

    def _forget(self, numbers: Sequence[int]) -> None:
        self.batches.forget(numbers)
        self.lag.forget(numbers)

    def keep_polled(self, records: list[Message]) -> list[Message]:
        """The polled records minus those of partitions revoked or lost during the poll."""
        touched = self._touched
        if not touched:
            return records
        pauser = self.partitions.pauser
        reseek = reseek_offsets(records, touched, self.partitions.assigned, pauser.paused)
        for partition, offset in sorted(reseek.items()):
            seek_back(self.consumer, TopicPartition(self.topic, partition, offset))
        kept = [m for m in records if partition_of(m) not in touched]
        if len(kept) < len(records):
            log_event(
                _log,
                "prefetched records dropped",
                partitions=sorted(touched & {partition_of(m) for m in records}),
                records=len(records) - len(kept),
                soughtBack=reseek,
            )
        return kept


def reseek_offsets(
    records: Sequence[Message],
    touched: Collection[int],
    assigned: Collection[int],
    paused: Collection[int],
) -> dict[int, int]:
    """Where to seek the partitions whose prefetched records are dropped although they are
    ours again (revoked or lost and assigned back during the same poll): their first dropped
    offset. A paused partition keeps the position its pause sought it to."""
    first: dict[int, int] = {}
    for message in records:
        partition = partition_of(message)
        if partition in touched and partition not in first:
            first[partition] = offset_of(message)
    return {p: o for p, o in first.items() if p in assigned and p not in paused}
