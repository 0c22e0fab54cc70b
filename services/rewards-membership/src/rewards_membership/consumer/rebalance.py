"""Rebalance callbacks around the batch in flight and the records polled meanwhile.

Served inside `consume()`, on the poll thread. A revocation first finishes the batch in
flight (its transaction, dead letters and commit), so the next owner starts exactly after
what was applied; a loss waits for it but commits nothing of the lost partitions. The
partitions revoked or lost during a poll are remembered until the poll returns: records it
returned for them are dropped (never applied or committed here), and a partition assigned
back within the same poll is sought back to the first dropped record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field

from confluent_kafka import Consumer, Message, TopicPartition

from pin_runtime.logging import log_event
from rewards_membership.consumer.batch import reseek_offsets
from rewards_membership.consumer.partitions import PartitionControl, seek_back
from rewards_membership.records import partition_of

__all__ = ["RebalanceGuard"]

_log = logging.getLogger("rewards_membership.consumer.loop")


@dataclass(eq=False)
class RebalanceGuard:
    consumer: Consumer
    _: KW_ONLY
    topic: str
    partitions: PartitionControl
    settle: Callable[[Sequence[int]], None]
    """Finish the batch in flight, leaving out the given (lost) partitions."""
    on_assigned: Callable[[], None]
    _touched: set[int] = field(init=False, default_factory=set)

    def poll_started(self) -> None:
        self._touched.clear()

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.partitions.on_assign(consumer, partitions)
        self.on_assigned()

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._touched.update(tp.partition for tp in partitions)
        self.settle(())
        self.partitions.on_revoke(consumer, partitions)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Lost: another member may own them already; nothing of them is committed here.
        numbers = [tp.partition for tp in partitions]
        self._touched.update(numbers)
        self.settle(numbers)
        self.partitions.on_lost(consumer, partitions)

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
