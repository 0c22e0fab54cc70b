"""The membership consumer loop: batches from Kafka, no single record stopping the flow.

One batch = one `consume()`:

1. validate every record (pure) and key it for the inbox (MessageId, else its position);
2. ONE transaction: inbox lookup first (spec step 1: a processed or dead-lettered MessageId
   is a duplicate), lock rows, decide in memory, write rows and inbox keys (`BatchApplier`);
3. write the dead letters (`DeadLetterer`): each once, a reference record when the DLQ
   refuses the copy for good; a retriable failure fails only that record's partition;
4. mark the acknowledged dead letters in the inbox;
5. commit the offsets of every partition that finished (`PartitionControl`); pause and seek
   back the partitions that did not, each with its own backoff (1 s -> 60 s).

A database failure in 2 or 4 concerns the whole batch: every partition of it is paused and
retried after a `SELECT 1` probe. Stall gauges are refreshed every lag interval whatever
happens (`LagReporter`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from pin_runtime.errors import DeliveryError
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.logging import log_event
from pin_runtime.postgres import is_retriable
from pin_runtime.shutdown import GracefulShutdown
from rewards_membership.applier import BatchApplier
from rewards_membership.deadletter import DeadLetterer, DeadLetterResult, Position, Receipt
from rewards_membership.errors import ConcurrentApplyError, is_infrastructure
from rewards_membership.lag import LagReporter
from rewards_membership.metrics import Metrics
from rewards_membership.partitions import POSTGRESQL, PartitionControl
from rewards_membership.pauser import PartitionPauser
from rewards_membership.plan import Outcome
from rewards_membership.records import offset_of, partition_of, topic_of
from rewards_membership.report import BatchReporter, Item, process_span, receive_span
from rewards_membership.store import MembershipStore
from rewards_membership.validation import InvalidEvent, position_key, validate

__all__ = ["ConsumerOptions", "MembershipConsumer"]

_log = logging.getLogger("rewards_membership.consumer")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerOptions:
    topic: str
    group_id: str
    batch_size: int = 1000
    poll_timeout: float = 1.0
    retry_initial: float = 1.0
    retry_max: float = 60.0
    lag_interval: float = 5.0


class MembershipConsumer:
    """Owns the poll loop; everything it uses is handed in (built by `app.build_consumer`)."""

    def __init__(
        self,
        *,
        options: ConsumerOptions,
        consumer: Consumer,
        store: MembershipStore,
        dead_letters: DeadLetterer,
        metrics: Metrics,
        heartbeat: Heartbeat | None = None,
        database_state: ComponentState | None = None,
        kafka_state: ComponentState | None = None,
        tracer: trace.Tracer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._options = options
        self._consumer = consumer
        self._dead_letters = dead_letters
        self._heartbeat = heartbeat
        self.database_state = database_state or ComponentState()
        self.kafka_state = kafka_state or ComponentState()
        self._tracer = tracer or trace.get_tracer("rewards_membership")
        self._clock = clock
        self._applier = BatchApplier(store, self._tracer)
        self._lag = LagReporter(
            consumer,
            topic=options.topic,
            metrics=metrics,
            interval=options.lag_interval,
            clock=clock,
        )
        pauser = PartitionPauser(initial=options.retry_initial, maximum=options.retry_max)
        self._partitions = PartitionControl(
            consumer,
            topic=options.topic,
            pauser=pauser,
            metrics=metrics,
            clock=clock,
            on_committed=lambda p, offset: dead_letters.forget(p, below=offset),
            on_forget=self._forget,
        )
        self._reporter = BatchReporter(
            metrics=metrics, tracer=self._tracer, topic=options.topic, group_id=options.group_id
        )

    def run(self, stop: GracefulShutdown) -> None:
        """Poll until `stop` is requested; then finish the batch, commit, leave the group."""
        self.subscribe()
        try:
            while not stop.requested:
                self.poll_once()
        finally:
            self.close()

    def subscribe(self) -> None:
        self._probe_database()
        p = self._partitions
        self._consumer.subscribe(
            [self._options.topic],
            on_assign=self._on_assign,
            on_revoke=p.on_revoke,
            on_lost=p.on_lost,
        )

    def close(self) -> None:
        """Commit what is applied, leave the group (close), release the database."""
        try:
            self._partitions.commit(raise_errors=False)
        finally:
            try:
                self._consumer.close()
            finally:
                self._applier.close()
        log_event(_log, "consumer closed", topic=self._options.topic)

    @property
    def paused_partitions(self) -> frozenset[int]:
        return self._partitions.pauser.paused

    @property
    def assigned_partitions(self) -> frozenset[int]:
        return frozenset(self._partitions.assigned)

    def poll_once(self) -> int:
        """One turn of the loop; returns the number of records handled."""
        if self._heartbeat is not None:
            self._heartbeat.beat()
        self._partitions.resume_due(self._probe_database)
        messages = self._consumer.consume(
            num_messages=self._options.batch_size, timeout=self._options.poll_timeout
        )
        pauser = self._partitions.pauser
        # A record of a partition paused meanwhile is read again after its seek back.
        records = [m for m in messages if _is_record(m) and not pauser.is_paused(partition_of(m))]
        if records:
            self._handle(records)
        self._lag.maybe_report(
            self._partitions.assigned, pauser.paused_for(self._clock()), self._unreplayed
        )
        return len(records)

    def _handle(self, records: Sequence[Message]) -> None:
        started = self._clock()
        first: dict[int, int] = {}
        for message in records:
            first.setdefault(partition_of(message), offset_of(message))
        topic, group = self._options.topic, self._options.group_id
        with receive_span(self._tracer, topic, group, records) as span:
            try:
                with process_span(self._tracer, topic, len(records)):
                    items = [_keyed(m, validate(m.value())) for m in records]
                    plan = self._applier.apply(items)
                    letters, receipts = self._dead_letter(records, items, plan.outcomes)
                    done = {
                        partition_of(m): offset_of(m) + 1
                        for m in records
                        if partition_of(m) not in letters.failed
                    }
                    self._partitions.ledger.applied(done)
                    self._partitions.commit(done, raise_errors=True)
            except Exception as exc:
                if not is_infrastructure(exc):
                    span.record_exception(exc)
                    raise
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                self._fail(first, exc)
                return
            for partition, failure in letters.failed.items():
                # Only this partition: its dead letter could not be written.
                self._fail({partition: first[partition]}, DeliveryError(str(failure)), batch=False)
            self._partitions.pauser.succeeded(done)
            self._healthy()
            self._reporter.report(
                _finished(records, items, plan.outcomes, done, receipts),
                receipts,
                elapsed_ms=(self._clock() - started) * 1000.0,
                batch_context=span.get_span_context(),
            )

    def _dead_letter(
        self, records: Sequence[Message], items: Sequence[Item], outcomes: Sequence[Outcome]
    ) -> tuple[DeadLetterResult, dict[Position, Receipt]]:
        """Write the batch's dead letters, mark the acknowledged ones in the inbox; say where
        every invalid record of the batch is in the DLQ (taken now: a commit forgets it)."""
        dead = [
            (m, item)
            for m, item, outcome in zip(records, items, outcomes, strict=True)
            if isinstance(item, InvalidEvent) and outcome is Outcome.DEAD_LETTERED
        ]
        letters = self._dead_letters.write(dead)
        acknowledged = [item.key for m, item in dead if item.key and _at(m) in letters.acknowledged]
        self._applier.mark_dead_lettered(acknowledged)
        receipts = {
            _at(m): receipt
            for m, item in zip(records, items, strict=True)
            if isinstance(item, InvalidEvent)
            and (receipt := self._dead_letters.receipt(_at(m))) is not None
        }
        return letters, receipts

    def _fail(self, first: dict[int, int], exc: BaseException, *, batch: bool = True) -> None:
        dependency = _dependency(exc)
        reason = f"{type(exc).__name__}: {exc}".strip()[:300]
        if dependency == POSTGRESQL:
            self._applier.discard()
            self.database_state.degraded(reason)
        else:
            self.kafka_state.degraded(reason)
        event = "batch rolled back, partitions paused" if batch else "dead letter not written"
        self._partitions.pause(first, dependency=dependency, reason=reason, event=event)

    def _unreplayed(self) -> int | None:
        # Not while the database is known down: a connect attempt would stall the loop.
        if self._partitions.pauser.down(POSTGRESQL) is not None:
            return None
        return self._applier.count_unreplayed()

    def _healthy(self) -> None:
        self.database_state.ok()
        if "kafka" not in self._partitions.pauser.dependencies():
            self.kafka_state.ok()

    def _probe_database(self) -> bool:
        error = self._applier.probe()
        if error is not None:
            self.database_state.degraded(f"{type(error).__name__}: {error}".strip()[:300])
            return False
        self.database_state.ok()
        return True

    def _on_assign(self, consumer: Consumer, partitions: list[Any]) -> None:
        self._partitions.on_assign(consumer, partitions)
        self.kafka_state.ok()
        self._lag.soon()

    def _forget(self, partitions: Sequence[int]) -> None:
        for partition in partitions:
            self._dead_letters.forget(partition)
        self._lag.forget(partitions)


def _finished(
    records: Sequence[Message],
    items: Sequence[Item],
    outcomes: Sequence[Outcome],
    done: Mapping[int, int],
    receipts: Mapping[Position, Receipt],
) -> list[tuple[Message, Item, Outcome]]:
    """The committed records with the outcomes to report."""
    finished = []
    for m, item, outcome in zip(records, items, outcomes, strict=True):
        if partition_of(m) not in done:
            continue
        # A duplicate we dead-lettered ourselves in an earlier try of this batch (marked,
        # then the batch failed): it is the dead letter it was.
        reported = Outcome.DEAD_LETTERED if _at(m) in receipts else outcome
        finished.append((m, item, reported))
    return finished


def _at(message: Message) -> tuple[int, int]:
    return (partition_of(message), offset_of(message))


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


def _dependency(exc: BaseException) -> str:
    if isinstance(exc, psycopg.Error | ConcurrentApplyError) or (
        not isinstance(exc, KafkaException | DeliveryError) and is_retriable(exc)
    ):
        return POSTGRESQL
    return "kafka"
