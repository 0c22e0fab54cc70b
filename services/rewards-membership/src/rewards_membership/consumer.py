"""The membership consumer: batches from Kafka, one transaction each, offsets after commit.

One batch = one `consume()`: validate every record (pure), then in ONE transaction read the
inbox keys and lock the rows the batch touches, decide in memory (`plan_batch`), write rows
and inbox keys; after the commit, flush the batch's dead letters, then commit its offsets.
An infrastructure failure rolls back, seeks the batch's partitions back to their first
offset, pauses them and retries with backoff while the loop keeps polling (the consumer
stays in its group); nothing is skipped, and the inbox makes a redelivery a no-op.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from pin_contracts import TRACEPARENT_HEADER
from pin_runtime.backoff import Backoff
from pin_runtime.errors import DeliveryError
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.logging import log_event
from pin_runtime.postgres import is_retriable
from pin_runtime.shutdown import GracefulShutdown
from pin_runtime.tracing import extract_context
from rewards_membership.dlq import DeadLetterWriter
from rewards_membership.errors import ConcurrentApplyError, is_infrastructure
from rewards_membership.metrics import Metrics
from rewards_membership.plan import BatchPlan, Outcome, inbox_keys, plan_batch, row_keys
from rewards_membership.records import key_text, offset_of, partition_of
from rewards_membership.store import MembershipStore
from rewards_membership.validation import (
    EXPECTED_CONTRACT_VERSION,
    InvalidEvent,
    MembershipChange,
    validate,
)

__all__ = ["ConsumerOptions", "MembershipConsumer"]

_log = logging.getLogger("rewards_membership.consumer")
# A row or inbox key committed by another instance between our read and our write: re-read
# and re-decide at once, a few times, before treating it as an outage.
_CONCURRENT_RETRIES: Final = 5
_MAX_LINKS: Final = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerOptions:
    topic: str
    group_id: str
    batch_size: int = 1000
    poll_timeout: float = 1.0
    retry_initial: float = 1.0
    retry_max: float = 60.0
    lag_interval: float = 5.0


@dataclass(slots=True)
class _Health:
    database: ComponentState = field(default_factory=ComponentState)
    kafka: ComponentState = field(default_factory=ComponentState)


Item = MembershipChange | InvalidEvent


class MembershipConsumer:
    """Owns the poll loop; everything it uses is handed in (built by `app.build`)."""

    def __init__(
        self,
        *,
        options: ConsumerOptions,
        consumer: Consumer,
        store: MembershipStore,
        dead_letters: DeadLetterWriter,
        metrics: Metrics,
        heartbeat: Heartbeat | None = None,
        database_state: ComponentState | None = None,
        kafka_state: ComponentState | None = None,
        tracer: trace.Tracer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._options = options
        self._consumer = consumer
        self._store = store
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._heartbeat = heartbeat
        self.database_state = database_state or ComponentState()
        self.kafka_state = kafka_state or ComponentState()
        self._tracer = tracer or trace.get_tracer("rewards_membership")
        self._clock = clock
        self._backoff = Backoff(initial=options.retry_initial, maximum=options.retry_max)
        self._paused: set[int] = set()
        self._retry_at: float | None = None
        self._failed_dependency: str | None = None
        # Offsets (next to read) applied in the database but not yet committed to Kafka.
        self._done: dict[int, int] = {}
        self._assigned: set[int] = set()
        self._next_lag_update = 0.0

    # -- lifecycle -------------------------------------------------------------------------

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
        self._consumer.subscribe(
            [self._options.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def close(self) -> None:
        """Commit what is applied, leave the group (close), release the database."""
        try:
            self._commit_done(self._done.keys())
        finally:
            try:
                self._consumer.close()
            finally:
                self._store.close()
        log_event(_log, "consumer closed", topic=self._options.topic)

    @property
    def paused_partitions(self) -> frozenset[int]:
        return frozenset(self._paused)

    @property
    def assigned_partitions(self) -> frozenset[int]:
        return frozenset(self._assigned)

    # -- the loop --------------------------------------------------------------------------

    def poll_once(self) -> int:
        """One turn of the loop; returns the number of records handled."""
        if self._heartbeat is not None:
            self._heartbeat.beat()
        self._maybe_resume()
        messages = self._consumer.consume(
            num_messages=self._options.batch_size, timeout=self._options.poll_timeout
        )
        records = [m for m in messages if self._is_record(m)]
        if records:
            self._handle(records)
        self._maybe_update_lag()
        return len(records)

    def _is_record(self, message: Message) -> bool:
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

    def _handle(self, records: Sequence[Message]) -> None:
        started = self._clock()
        topic = self._options.topic
        links = []
        for message in records[:_MAX_LINKS]:
            context = trace.get_current_span(extract_context(message.headers())).get_span_context()
            if context.is_valid:
                links.append(Link(context))
        with self._tracer.start_as_current_span(
            f"{topic} receive",
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "receive",
                "messaging.operation.name": "consume",
                "messaging.destination.name": topic,
                "messaging.consumer.group.name": self._options.group_id,
                "messaging.batch.message_count": len(records),
            },
        ) as receive_span:
            try:
                with self._tracer.start_as_current_span(
                    "membership batch process",
                    attributes={
                        "messaging.operation.type": "process",
                        "messaging.destination.name": topic,
                        "messaging.batch.message_count": len(records),
                    },
                ):
                    items: list[Item] = [validate(m.value()) for m in records]
                    plan = self._apply_and_commit(records, items)
            except Exception as exc:
                if not is_infrastructure(exc):
                    receive_span.record_exception(exc)
                    raise
                receive_span.set_status(Status(StatusCode.ERROR, str(exc)))
                self._fail(records, exc)
                return
            self._report(records, items, plan, started, receive_span.get_span_context())

    def _apply_and_commit(self, records: Sequence[Message], items: Sequence[Item]) -> BatchPlan:
        for attempt in range(1, _CONCURRENT_RETRIES + 1):
            try:
                plan = self._apply(items)
                break
            except ConcurrentApplyError:
                # The store dropped its transaction; re-read the rows and the inbox.
                if attempt == _CONCURRENT_RETRIES:
                    raise
                log_event(_log, "concurrent apply, re-deciding batch", attempt=attempt)
        invalid = [
            (message, item)
            for message, item in zip(records, items, strict=True)
            if isinstance(item, InvalidEvent)
        ]
        # The DLQ write is acknowledged before the offsets of its records are committed.
        self._dead_letters.send(invalid)
        offsets: dict[int, int] = {}
        for message in records:
            offsets[partition_of(message)] = offset_of(message) + 1
        self._done.update(offsets)
        self._commit_done(offsets.keys(), raise_errors=True)
        return plan

    def _apply(self, items: Sequence[Item]) -> BatchPlan:
        keys = inbox_keys(items)
        pairs = row_keys(items)
        if not keys:
            return plan_batch(items, set(), {})
        with self._tracer.start_as_current_span(
            "pg apply batch",
            kind=SpanKind.CLIENT,
            attributes={
                "db.system.name": "postgresql",
                "db.system": "postgresql",
                "db.namespace": "rewards",
                "db.operation.name": "apply membership batch",
                "db.operation.batch.size": len(keys),
            },
        ):
            conn = self._store.connection()
            with conn.transaction():
                seen = self._store.seen_keys(conn, keys)
                rows = self._store.lock_rows(conn, pairs)
                plan = plan_batch(items, seen, rows)
                self._store.write(conn, plan)
        return plan

    def _commit_done(self, partitions: Any, *, raise_errors: bool = False) -> None:
        wanted = [p for p in list(partitions) if p in self._done]
        if not wanted:
            return
        offsets = [TopicPartition(self._options.topic, p, self._done[p]) for p in wanted]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError._NO_OFFSET:
                pass
            elif raise_errors:
                raise
            else:
                log_event(_log, "offset commit failed", logging.WARNING, reason=str(exc))
                return
        for p in wanted:
            self._done.pop(p, None)

    # -- failure and recovery --------------------------------------------------------------

    def _fail(self, records: Sequence[Message], exc: Exception) -> None:
        dependency = _dependency(exc)
        if dependency == "postgresql":
            self._store.discard()
            self.database_state.degraded(f"{type(exc).__name__}: {exc}".strip()[:300])
        else:
            self.kafka_state.degraded(f"{type(exc).__name__}: {exc}".strip()[:300])
        first: dict[int, int] = {}
        for message in records:
            first.setdefault(partition_of(message), offset_of(message))
        topic = self._options.topic
        for partition, offset in first.items():
            tp = TopicPartition(topic, partition, offset)
            try:
                self._consumer.pause([tp])
                self._consumer.seek(tp)
            except KafkaException as error:  # partition revoked meanwhile: the next owner reads it
                log_event(
                    _log,
                    "seek back failed",
                    logging.WARNING,
                    partition=partition,
                    reason=str(error),
                )
                continue
            self._paused.add(partition)
        delay = self._backoff.next_delay()
        self._retry_at = self._clock() + delay
        self._failed_dependency = dependency
        self._metrics.retries.labels(dependency).inc()
        self._metrics.paused_partitions.set(len(self._paused))
        log_event(
            _log,
            "batch rolled back, partitions paused",
            logging.WARNING,
            dependency=dependency,
            reason=f"{type(exc).__name__}: {exc}",
            partitions=sorted(first),
            firstOffsets=first,
            retryInSeconds=round(delay, 3),
            attempt=self._backoff.attempts,
        )

    def _probe_database(self) -> bool:
        try:
            self._store.connection().execute("SELECT 1")
        except psycopg.Error as exc:
            self._store.discard()
            self.database_state.degraded(f"{type(exc).__name__}: {exc}".strip()[:300])
            return False
        self.database_state.ok()
        return True

    def _maybe_resume(self) -> None:
        if self._retry_at is None or self._clock() < self._retry_at:
            return
        if self._failed_dependency == "postgresql" and not self._probe_database():
            delay = self._backoff.next_delay()
            self._retry_at = self._clock() + delay
            self._metrics.retries.labels("postgresql").inc()
            log_event(
                _log,
                "dependency still down",
                logging.WARNING,
                dependency="postgresql",
                retryInSeconds=round(delay, 3),
                attempt=self._backoff.attempts,
            )
            return
        partitions = [TopicPartition(self._options.topic, p) for p in sorted(self._paused)]
        if partitions:
            self._consumer.resume(partitions)
        log_event(_log, "partitions resumed", partitions=sorted(self._paused))
        self._paused.clear()
        self._metrics.paused_partitions.set(0)
        self._retry_at = None
        self._failed_dependency = None

    # -- rebalance -------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        numbers = [tp.partition for tp in partitions]
        self._assigned.update(numbers)
        self.kafka_state.ok()
        if self._retry_at is not None and partitions:
            # A dependency is down: new partitions wait with the others until the retry.
            consumer.pause(partitions)
            self._paused.update(numbers)
            self._metrics.paused_partitions.set(len(self._paused))
        elif partitions:
            # librdkafka keeps a partition's pause flag across a lost and re-assigned
            # assignment: one paused by a failed batch before the session timed out would
            # come back paused, with nobody left to resume it. State it explicitly.
            consumer.resume(partitions)
        self._next_lag_update = 0.0
        log_event(_log, "partitions assigned", partitions=numbers, paused=sorted(self._paused))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        # Everything applied is committed before the partition moves to its next owner.
        self._commit_done(numbers)
        self._forget(numbers)
        log_event(_log, "partitions revoked", partitions=numbers)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        self._forget(numbers)
        log_event(_log, "partitions lost", logging.WARNING, partitions=numbers)

    def _forget(self, numbers: Sequence[int]) -> None:
        for p in numbers:
            self._done.pop(p, None)
            self._paused.discard(p)
            self._assigned.discard(p)
            with contextlib.suppress(KeyError):
                self._metrics.consumer_lag.remove(str(p))
        self._metrics.paused_partitions.set(len(self._paused))

    # -- observability ---------------------------------------------------------------------

    def _maybe_update_lag(self) -> None:
        now = self._clock()
        if now < self._next_lag_update or not self._assigned:
            return
        self._next_lag_update = now + self._options.lag_interval
        topic = self._options.topic
        try:
            positions = self._consumer.position(
                [TopicPartition(topic, p) for p in sorted(self._assigned)]
            )
        except KafkaException:
            return
        for tp in positions:
            try:
                _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                continue
            if high < 0:
                continue
            position = tp.offset if tp.offset >= 0 else self._done.get(tp.partition, -1)
            if position < 0:
                continue
            self._metrics.consumer_lag.labels(str(tp.partition)).set(max(0, high - position))

    def _report(
        self,
        records: Sequence[Message],
        items: Sequence[Item],
        plan: BatchPlan,
        started: float,
        batch_context: trace.SpanContext,
    ) -> None:
        """Metrics and logs of a committed batch (only now: a rolled-back one is retried)."""
        metrics = self._metrics
        self._backoff.reset()
        self.database_state.ok()
        self.kafka_state.ok()
        elapsed_ms = (self._clock() - started) * 1000.0
        now = datetime.now(UTC).timestamp()
        oldest: float | None = None
        info = _log.isEnabledFor(logging.INFO)
        debug = _log.isEnabledFor(logging.DEBUG)
        counts: Counter[tuple[Outcome, str]] = Counter()
        # One observation per batch: every message of it took this long from poll to commit.
        metrics.consume_duration_ms.observe(elapsed_ms)
        for message, item, outcome in zip(records, items, plan.outcomes, strict=True):
            if _has_traceparent(message):
                self._process_span(message, item, outcome, batch_context)
            if isinstance(item, InvalidEvent):
                self._report_invalid(message, item)
                _, timestamp_ms = message.timestamp()
                event_time = timestamp_ms / 1000.0 if timestamp_ms > 0 else now
            else:
                self._report_change(item, outcome, counts, info=info, debug=debug)
                event_time = item.occurred_at.timestamp()
            age = now - event_time
            oldest = age if oldest is None else max(oldest, age)
        self._count(counts)
        if oldest is not None:
            metrics.lag_seconds.set(max(0.0, oldest))
        metrics.batch_size.observe(len(records))

    def _report_invalid(self, message: Message, item: InvalidEvent) -> None:
        self._metrics.dlq.labels(item.error_code).inc()
        log_event(
            _log,
            Outcome.DEAD_LETTERED.value,
            logging.ERROR,
            MessageId=item.message_id,
            **item.fields,
            code=item.error_code,
            reason=item.message,
            partition=partition_of(message),
            offset=offset_of(message),
            key=key_text(message),
        )

    def _report_change(
        self,
        item: MembershipChange,
        outcome: Outcome,
        counts: Counter[tuple[Outcome, str]],
        *,
        info: bool,
        debug: bool,
    ) -> None:
        if debug:
            log_event(_log, "consumed", logging.DEBUG, **_fields(item))
        counts[(outcome, item.status.value)] += 1
        if outcome is not Outcome.DUPLICATE:
            self._report_warnings(item)
        if info:
            log_event(_log, outcome.value, **_fields(item))

    def _report_warnings(self, item: MembershipChange) -> None:
        metrics = self._metrics
        if item.contract_mismatch:
            metrics.contract_mismatch.labels(str(item.contract_version)).inc()
            log_event(
                _log,
                "contract-version-mismatch",
                logging.WARNING,
                expectedContractVersion=EXPECTED_CONTRACT_VERSION,
                ContractVersion=item.contract_version,
                **_fields(item),
            )
        if item.unknown_status:
            metrics.unknown_status.inc()
            log_event(_log, "unknown-membership-status", logging.WARNING, **_fields(item))
        if item.unknown_reason:
            metrics.unknown_reason.inc()
            log_event(_log, "unknown-leave-reason", logging.WARNING, **_fields(item))

    def _count(self, counts: Counter[tuple[Outcome, str]]) -> None:
        # Counters move once per batch, not per message: the hot loop stays cheap.
        metrics = self._metrics
        for (outcome, status), n in counts.items():
            if outcome is Outcome.APPLIED:
                metrics.applied.labels(status).inc(n)
            elif outcome is Outcome.STALE:
                metrics.skipped_stale.inc(n)
            else:
                metrics.skipped_duplicate.inc(n)

    def _process_span(
        self, message: Message, item: Item, outcome: Outcome, batch: trace.SpanContext
    ) -> None:
        """A per-message span continuing the producer's trace (only for traced messages)."""
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.destination.name": self._options.topic,
            "messaging.consumer.group.name": self._options.group_id,
            "messaging.destination.partition.id": str(partition_of(message)),
            "messaging.kafka.offset": offset_of(message),
            "rewards.membership.outcome": outcome.value,
        }
        key = key_text(message)
        if key is not None:
            attributes["messaging.kafka.message.key"] = key
        if item.message_id is not None:
            attributes["messaging.message.id"] = str(item.message_id)
        span = self._tracer.start_span(
            f"{self._options.topic} process",
            context=extract_context(message.headers()),
            kind=SpanKind.CONSUMER,
            links=[Link(batch)],
            attributes=attributes,
        )
        if outcome is Outcome.DEAD_LETTERED:
            span.set_status(Status(StatusCode.ERROR, "REWARDS_MEMBERSHIP_EVENT_INVALID"))
        span.end()


def _has_traceparent(message: Message) -> bool:
    headers = message.headers()
    if not headers:
        return False
    if isinstance(headers, dict):
        return TRACEPARENT_HEADER in headers
    return any(name == TRACEPARENT_HEADER for name, _ in headers)


def _fields(item: MembershipChange) -> dict[str, Any]:
    return {
        "MessageId": item.message_id,
        "AgentUserId": item.agent_user_id,
        "CompanyId": item.company_id,
        "Status": item.raw_status,
        "Reason": item.raw_reason,
        "Version": item.version,
        "MembershipId": item.membership_id,
    }


def _dependency(exc: BaseException) -> str:
    if isinstance(exc, DeliveryError):
        return "kafka-dlq"
    if isinstance(exc, psycopg.Error | ConcurrentApplyError) or is_retriable(exc):
        return "postgresql"
    return "kafka"
