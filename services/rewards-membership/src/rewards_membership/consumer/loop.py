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

import msgspec
from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from opentelemetry import trace

from pin_runtime.http import Check, ComponentState, Heartbeat
from pin_runtime.logging import log_event
from pin_runtime.shutdown import GracefulShutdown
from rewards_membership.batch_sql import records_document
from rewards_membership.consumer.batch import Batches, keep_partitions
from rewards_membership.consumer.database import BatchApplier, DatabaseThread
from rewards_membership.consumer.lag import LagReporter
from rewards_membership.consumer.partitions import POSTGRESQL, PartitionControl, PartitionPauser
from rewards_membership.consumer.rebalance import RebalanceGuard
from rewards_membership.consumer.report import BatchReporter
from rewards_membership.consumer.spans import BatchSpans
from rewards_membership.dlq.writer import DeadLetterer
from rewards_membership.metrics import Metrics
from rewards_membership.records import offset_of, partition_of, topic_of
from rewards_membership.rules.validation import InvalidEvent, Item, position_key, validate
from rewards_membership.settings import Settings
from rewards_membership.store import MembershipStore

__all__ = ["MembershipConsumer"]

_log = logging.getLogger(__name__)


class MembershipConsumer:
    """Owns the poll loop; everything it uses is handed in (built by `app.build_consumer`)."""

    def __init__(
        self,
        *,
        settings: Settings,
        consumer: Consumer,
        offsets_reader: Consumer,
        store: MembershipStore,
        dead_letters: DeadLetterer,
        metrics: Metrics,
        heartbeat: Heartbeat | None = None,
        database_state: ComponentState | None = None,
        kafka_state: ComponentState | None = None,
        tracer: trace.Tracer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # The loop reads its own settings (topic, group, batch, poll, backoff, lag interval).
        self._topic = settings.topic
        self._batch_size = settings.batch_size
        self._poll_timeout = settings.poll_timeout.total_seconds()
        self._consumer = consumer
        self._heartbeat = heartbeat
        self.database_state = database_state or ComponentState()
        self.kafka_state = kafka_state or ComponentState()
        tracer = tracer or trace.get_tracer("rewards_membership")
        self._clock = clock
        self._database = DatabaseThread(BatchApplier(store, tracer))
        self._lag = LagReporter(
            offsets_reader,
            topic=settings.topic,
            metrics=metrics,
            interval=settings.lag_interval.total_seconds(),
            clock=clock,
        )
        pauser = PartitionPauser(
            initial=settings.retry_initial.total_seconds(),
            maximum=settings.retry_max.total_seconds(),
        )
        self._partitions = PartitionControl(
            consumer,
            topic=settings.topic,
            pauser=pauser,
            metrics=metrics,
            clock=clock,
        )
        spans = BatchSpans(tracer=tracer, topic=settings.topic, group_id=settings.group_id)
        self._batches = Batches(
            database=self._database,
            dead_letters=dead_letters,
            partitions=self._partitions,
            reporter=BatchReporter(metrics=metrics, spans=spans),
            database_state=self.database_state,
            kafka_state=self.kafka_state,
        )
        self._rebalances = RebalanceGuard(
            consumer,
            topic=settings.topic,
            partitions=self._partitions,
            batches=self._batches,
            lag=self._lag,
            kafka_state=self.kafka_state,
        )

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
        poll_returned = time.time_ns()
        records = self._rebalances.keep_polled([m for m in messages if _is_record(m)])
        # Decoded, and the batch statement's document encoded, while the batch before is in
        # its transaction on the database thread.
        items: list[Item] = [_keyed(m, validate(m.value(), m.key())) for m in records]
        document: str | None = records_document(items) if items else None
        # Partitions lost during the poll are left out of it: nothing of them is committed.
        self._batches.finish(self._rebalances.lost)
        pauser, assigned = self._partitions.pauser, self._partitions.assigned
        # A partition paused meanwhile (the batch before failed) was sought back: its
        # records are read again after the pause.
        polled = len(items)
        records, items = keep_partitions(
            records, items, lambda p: p in assigned and not pauser.is_paused(p)
        )
        if len(items) != polled:
            document = None  # records were dropped: encoded again for those kept
        self._lag.maybe_report(assigned, pauser.paused_for(self._clock()), self._unreplayed)
        if records:
            # Logs `consumed` for each record as it is handed over, in the batch's span.
            self._batches.start(records, items, document, poll=(poll_started, poll_returned))
        self._batches.report()
        return len(records)

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


def _keyed(message: Message, item: Item) -> Item:
    """An invalid record without a readable MessageId is keyed by its position."""
    if isinstance(item, InvalidEvent) and item.key is None:
        key = position_key(topic_of(message), partition_of(message), offset_of(message))
        return msgspec.structs.replace(item, key=key)
    return item


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
