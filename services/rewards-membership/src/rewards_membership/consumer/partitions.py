"""The Kafka side of the partitions: pause and seek back, resume, commit, rebalance.

Decisions live in the pure `PartitionPauser` and `OffsetLedger`; this class applies them to
the confluent-kafka consumer. Rebalance safety: the pause state of every assigned partition
is stated explicitly on assignment (librdkafka keeps a pause flag across a lost and
re-assigned partition), applied offsets are committed on revoke, and everything known of a
partition is forgotten when it leaves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pin_runtime.logging import log_event
from rewards_membership.consumer.ledger import OffsetLedger
from rewards_membership.consumer.pauser import PartitionPauser
from rewards_membership.metrics import Metrics

# Commit errors of a group between generations: the commit may be retried once it settled.
_REBALANCING: Final = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.UNKNOWN_MEMBER_ID,
    }
)

__all__ = ["PartitionControl"]

_log = logging.getLogger("rewards_membership.consumer.loop")
POSTGRESQL = "postgresql"


def seek_back(consumer: Consumer, tp: TopicPartition, *, pause: bool = False) -> bool:
    """Rewind a partition to `tp.offset` (paused first if asked), so its records are read
    again. False, logged, when it cannot be: the partition was revoked meanwhile and its
    next owner reads it from the committed offset."""
    try:
        if pause:
            consumer.pause([tp])
        consumer.seek(tp)
    except KafkaException as error:
        log_event(
            _log, "seek back failed", logging.WARNING, partition=tp.partition, reason=str(error)
        )
        return False
    return True


class PartitionControl:
    def __init__(
        self,
        consumer: Consumer,
        *,
        topic: str,
        pauser: PartitionPauser,
        metrics: Metrics,
        clock: Callable[[], float],
        on_committed: Callable[[int, int], None],
        on_forget: Callable[[Sequence[int]], None],
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self.pauser = pauser
        self.ledger = OffsetLedger()
        self._metrics = metrics
        self._clock = clock
        self._on_committed = on_committed
        self._on_forget = on_forget
        self.assigned: set[int] = set()

    def pause(self, first: Mapping[int, int], *, dependency: str, reason: str, event: str) -> None:
        """Seek each partition back to `first[p]` and pause it until its backoff ends."""
        now = self._clock()
        delays = []
        for partition, offset in sorted(first.items()):
            tp = TopicPartition(self._topic, partition, offset)
            if not seek_back(self._consumer, tp, pause=True):
                continue
            pause = self.pauser.pause(
                partition, seek_to=offset, dependency=dependency, reason=reason, now=now
            )
            delays.append(round(pause.retry_at - now, 3))
        self._metrics.retries.labels(dependency).inc()
        self._metrics.paused_partitions.set(len(self.pauser.paused))
        log_event(
            _log,
            event,
            logging.WARNING,
            dependency=dependency,
            reason=reason,
            partitions=sorted(first),
            firstOffsets=dict(first),
            retryInSeconds=max(delays) if delays else None,
        )

    def resume_due(self, probe: Callable[[], bool]) -> None:
        """Resume partitions whose backoff ended (after a probe, when the database failed)."""
        now = self._clock()
        due = self.pauser.due(now)
        if not due:
            return
        waiting_db = [p for p in due if self._dependency(p) == POSTGRESQL]
        if waiting_db and not probe():
            for partition in waiting_db:
                pause = self.pauser.postpone(partition, now=now)
            self._metrics.retries.labels(POSTGRESQL).inc()
            log_event(
                _log,
                "dependency still down",
                logging.WARNING,
                dependency=POSTGRESQL,
                retryInSeconds=round(pause.retry_at - now, 3),
                attempt=pause.attempts,
            )
            due = [p for p in due if p not in waiting_db]
        if due:
            self._consumer.resume([TopicPartition(self._topic, p) for p in due])
            self.pauser.resume(due)
            log_event(_log, "partitions resumed", partitions=due)
        self._metrics.paused_partitions.set(len(self.pauser.paused))

    def _dependency(self, partition: int) -> str | None:
        pause = self.pauser.get(partition)
        return pause.dependency if pause is not None else None

    def commit(self, partitions: Iterable[int] | None = None, *, raise_errors: bool) -> None:
        """Commit the ledger's offsets (of `partitions`); synchronous."""
        offsets = self.ledger.committable(partitions)
        if not offsets:
            return
        tps = [TopicPartition(self._topic, p, o) for p, o in offsets.items()]
        try:
            self._consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code in _REBALANCING:
                # The group is rebalancing: the records are applied (the inbox has them), so
                # the offsets stay in the ledger and go with the next commit (the next batch,
                # or the revocation). Failing the batch instead would read it again for
                # nothing. Should the partition move first, its next owner skips them as
                # duplicates.
                log_event(_log, "offset commit deferred", reason=str(exc), offsets=offsets)
                return
            if code != KafkaError._NO_OFFSET:
                if raise_errors:
                    raise
                log_event(_log, "offset commit failed", logging.WARNING, reason=str(exc))
                return
        self.ledger.committed(offsets)
        for partition, offset in offsets.items():
            self._on_committed(partition, offset)

    # -- rebalance callbacks ---------------------------------------------------------------

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        numbers = [tp.partition for tp in partitions]
        self.assigned.update(numbers)
        database_down = self.pauser.down(POSTGRESQL)
        if database_down is not None and partitions:
            # The database is down: new partitions wait with the others until the retry.
            consumer.pause(partitions)
            for partition in numbers:
                self.pauser.hold(partition, database_down, now=self._clock())
        elif partitions:
            consumer.resume(partitions)
        self._metrics.paused_partitions.set(len(self.pauser.paused))
        log_event(
            _log, "partitions assigned", partitions=numbers, paused=sorted(self.pauser.paused)
        )

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        # Everything applied is committed before the partition moves to its next owner.
        self.commit(numbers, raise_errors=False)
        self.forget(numbers)
        log_event(_log, "partitions revoked", partitions=numbers)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        self.forget(numbers)
        log_event(_log, "partitions lost", logging.WARNING, partitions=numbers)

    def forget(self, numbers: Sequence[int]) -> None:
        self.ledger.forget(numbers)
        self.pauser.forget(numbers)
        self.assigned.difference_update(numbers)
        self._on_forget(numbers)
        self._metrics.paused_partitions.set(len(self.pauser.paused))
