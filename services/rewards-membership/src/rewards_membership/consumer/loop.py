"""The membership consumer loop: batches from Kafka, Kafka and PostgreSQL overlapped.

While the database thread (`database.py`) applies batch N in its transaction, this thread
reports batch N-1, polls batch N+1 and decodes it; then it finishes N (`batch.py`: dead
letters, inbox marks, offset commit, or pause and seek back on failure) and only then hands
N+1 to the database thread. The batch in flight and the finished ones waiting to be
reported are kept by `batch.Batches`; this loop polls, validates and hands over.
So:

- offsets are committed only after their batch's transaction committed, and one batch at
  a time is in the database (inbox + projection in one transaction per batch, in order);
- every call on the Kafka consumer (poll, commit, seek, pause, rebalance callbacks) is made
  by this thread: librdkafka's consumer is not used from two threads;
- the prefetched batch keeps only records of partitions still ours and not paused when it
  is handed on: a failure of N pauses and seeks back N's partitions (their prefetched
  records are read again after the pause), a revoked or lost partition's prefetched
  records are dropped (never applied, never committed here);
- a revocation first finishes the batch in flight and commits it, so the next owner starts
  exactly after it; a loss waits for it but commits nothing of the lost partitions.

Stall gauges are refreshed every lag interval whatever happens (`LagReporter`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message

from pin_runtime.http import Check, ComponentState, Heartbeat
from pin_runtime.logging import log_event
from pin_runtime.shutdown import GracefulShutdown
from rewards_membership.consumer.batch import Batch, Batches
from rewards_membership.consumer.database import DatabaseThread
from rewards_membership.consumer.lag import LagReporter
from rewards_membership.consumer.partitions import POSTGRESQL, PartitionControl
from rewards_membership.consumer.rebalance import RebalanceGuard

__all__ = ["MembershipConsumer"]

_log = logging.getLogger(__name__)


class MembershipConsumer:
    """Owns the poll loop; every part it drives is built once by the composition root
    (`app.build_consumer`) and handed in."""

    def __init__(
        self,
        *,
        consumer: Consumer,
        topic: str,
        batch_size: int,
        poll_timeout: float,
        database: DatabaseThread,
        partitions: PartitionControl,
        batches: Batches,
        rebalances: RebalanceGuard,
        lag: LagReporter,
        database_state: ComponentState,
        kafka_state: ComponentState,
        heartbeat: Heartbeat | None,
        clock: Callable[[], float],
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._batch_size = batch_size
        self._poll_timeout = poll_timeout
        self._database = database
        self._partitions = partitions
        self._batches = batches
        self._rebalances = rebalances
        self._lag = lag
        self.database_state = database_state
        self.kafka_state = kafka_state
        self._heartbeat = heartbeat
        self._clock = clock

    def run(self, stop: GracefulShutdown, *, until: Callable[[], bool] | None = None) -> None:
        """Poll until `stop` is requested (or `until()` is true: the process builds its
        clients again); then finish the batch, commit, leave the group."""
        self.subscribe()
        try:
            while not stop.requested and not (until is not None and until()):
                self.poll_once()
        finally:
            self.close()

    def subscribe(self) -> None:
        self._probe_database()
        rebalances = self._rebalances
        self._consumer.subscribe(
            [self._topic],
            on_assign=rebalances.on_assign,
            on_revoke=rebalances.on_revoke,
            on_lost=rebalances.on_lost,
        )

    def close(self) -> None:
        """Finish the batch in flight, commit what is applied, leave the group (close),
        release the database."""
        try:
            try:
                self._batches.finish()
                self._batches.report()
            finally:
                self._partitions.commit(raise_errors=False)
        finally:
            try:
                self._consumer.close()
            finally:
                self._lag.close()
                self._database.close()
        log_event(_log, "consumer closed", topic=self._topic)

    def readiness_checks(self) -> dict[str, Check]:
        """`/readyz`'s checks: `postgresql` and `kafka` degrade while that dependency is
        down; `partitions` stays ready and lists the partitions paused (a row lock held
        elsewhere pauses one partition while the others are served)."""
        return {
            "postgresql": self.database_state,
            "kafka": self.kafka_state,
            "partitions": self._partitions.readiness,
        }

    @property
    def paused_partitions(self) -> frozenset[int]:
        return self._partitions.pauser.paused

    @property
    def assigned_partitions(self) -> frozenset[int]:
        return frozenset(self._partitions.assigned)

    def poll_once(self) -> int:
        """One turn of the loop; returns the number of records handed to the database."""
        if self._heartbeat is not None:
            self._heartbeat.beat()
        self._partitions.resume_due(self._probe_database)
        self._rebalances.poll_started()
        # While a batch is in its transaction, take what is fetched already and go on to
        # finish it: waiting here for more would hold its offset commit (and count in its
        # consume duration) for up to a poll timeout when records are few.
        timeout = self._poll_timeout if self._batches.in_flight is None else 0.0
        poll_started = time.time_ns()
        messages = self._consumer.consume(num_messages=self._batch_size, timeout=timeout)
        polled = time.time_ns()
        # Decoded, and the batch statement's document encoded, while the batch before is in
        # its transaction on the database thread.
        batch = Batch.of(
            self._rebalances.keep_polled([m for m in messages if _is_record(m)]),
            poll_started=poll_started,
            polled=polled,
        )
        # Partitions lost during the poll are left out of it: nothing of them is committed.
        self._batches.finish(self._rebalances.lost)
        pauser, assigned = self._partitions.pauser, self._partitions.assigned
        # A partition paused meanwhile (the batch before failed) was sought back: its
        # records are read again after the pause.
        batch.keep(lambda p: p in assigned and not pauser.is_paused(p))
        self._lag.maybe_report(assigned, pauser.paused_for(self._clock()), self._unreplayed)
        handed = len(batch)
        if handed:
            self._batches.start(batch)
        self._batches.report()
        return handed

    def _unreplayed(self) -> int | None:
        # Not while the database is known down: a connect attempt would stall the loop.
        if self._partitions.pauser.down(POSTGRESQL) is not None:
            return None
        return self._database.count_unreplayed()

    def _probe_database(self) -> bool:
        error = self._database.probe()
        if error is not None:
            self.database_state.degraded(f"{type(error).__name__}: {error}".strip()[:300])
            return False
        self.database_state.ok()
        return True


def _is_record(message: Message) -> bool:
    error = message.error()
    if error is None:
        return True
    if error.code() != KafkaError._PARTITION_EOF:
        log_event(
            _log,
            "kafka consume error",
            logging.WARNING,
            code=error.name(),
            reason=error.str(),
            fatal=error.fatal(),
        )
        if error.fatal():
            raise KafkaException(error)
    return False
