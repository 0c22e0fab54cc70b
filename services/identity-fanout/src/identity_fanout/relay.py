"""The outbox relay: the service's only publisher, one active instance at a time.

It moves committed rows of `identity.outbox` to Kafka in id order and deletes a row only
after the broker acknowledged it: at-least-once, never loss. Exactly one instance publishes
(a session advisory lock on the connection that also reads and deletes), which is what keeps
the per-key order the outbox ids give; the others wait as standbys and take over within
`lock_retry_interval` of the holder's connection ending.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Self

import psycopg
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry, Counter, Gauge
from psycopg import sql
from psycopg.rows import TupleRow

from identity_fanout import relay_queries as q
from identity_fanout.outbox import OUTBOX_CHANNEL
from identity_fanout.settings import SERVICE_NAME, Settings
from pin_runtime.backoff import Backoff
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.kafka import ConfigValue, create_producer
from pin_runtime.logging import log_event
from pin_runtime.postgres import is_retriable
from pin_runtime.tracing import Headers, extract_context

if TYPE_CHECKING:
    from identity_fanout.app import Runtime

__all__ = [
    "RELAY_LOCK_KEY",
    "OutboxRelay",
    "RelayMetrics",
    "RoundResult",
    "relay_main",
    "run_relay",
    "run_relay_process",
]

_log = logging.getLogger(__name__)

RELAY_LOCK_KEY: Final = -7336320232139186047
"""`pg_advisory_lock` key of the active relay (0x9a30279e4cd52081): the first 8 bytes of
sha256("pin-outbox-relay:identity.outbox") as a signed big-endian int64, the same recipe as
the migration lock (`pin-migrations:<schema>`), so the two never collide."""

LOCK_RETRY_INTERVAL: Final = 2.0
"""Seconds between a standby's attempts to take the lock: its take-over delay."""
SHUTDOWN_GRACE: Final = 5.0
"""On stop, how long in-flight deliveries may still take before the relay gives up on them
(they stay in the outbox and go out again later)."""
FLUSH_MARGIN: Final = 5.0
"""Added to the delivery timeout: librdkafka reports each message within its timeout, this
only covers scheduling slack."""
BACKLOG_EXACT_UP_TO: Final = 100_000
"""The backlog gauge counts rows exactly up to here, then reports the id span (cheap)."""
MAX_SPAN_LINKS: Final = 32
"""Links from a round's span to the traces that wrote its rows (distinct contexts, first N)."""
_WAKE_SLICE: Final = 0.5  # longest uninterruptible wait: bounds the reaction to `stop`


class RelayMetrics:
    """The relay's metrics on the given registry (never the process-global default)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.backlog = Gauge(
            "identity_outbox_backlog",
            "Outbox rows waiting to be published (exact up to 100000, then the id span).",
            registry=registry,
        )
        self.oldest_age_seconds = Gauge(
            "identity_outbox_oldest_age_seconds",
            "Age of the next row to publish (lowest id); 0 when the outbox is empty.",
            registry=registry,
        )
        self.published = Counter(
            "identity_outbox_published_total",
            "Outbox rows acknowledged by the broker and deleted.",
            registry=registry,
        )
        self.delivery_failures = Counter(
            "identity_outbox_delivery_failures_total",
            "Records of a round the broker did not acknowledge; their rows are retried.",
            registry=registry,
        )
        self.relay_active = Gauge(
            "identity_outbox_relay_active",
            "1 while this instance holds the relay lock and publishes, 0 on standby.",
            registry=registry,
        )


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round did; `error` is the first delivery failure, if any."""

    active: bool
    read: int = 0
    published: int = 0
    failed: int = 0
    first_id: int | None = None
    last_published_id: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _Record:
    id: int
    topic: str
    key: bytes
    value: bytes
    headers: Headers


def _record(row: TupleRow) -> _Record:
    id_, topic, key, payload, raw_headers = row
    return _Record(
        id=id_, topic=topic, key=key.encode(), value=bytes(payload), headers=_headers(raw_headers)
    )


def _headers(raw: object) -> Headers:
    """jsonb `[[name, value], ...]` (or an object, the column default) as Kafka headers."""
    pairs: Any = raw.items() if isinstance(raw, dict) else (raw or [])
    return [(str(name), None if value is None else str(value).encode()) for name, value in pairs]


class _Acks:
    """Delivery outcome per record of one round, by position (DeliveryTracker only counts)."""

    def __init__(self, size: int) -> None:
        self.ok = [False] * size
        self.errors: dict[int, KafkaError] = {}
        self.pending = 0

    def expect(self, index: int) -> Callable[[KafkaError | None, Message], None]:
        self.pending += 1

        def on_delivery(error: KafkaError | None, _message: Message) -> None:
            self.pending -= 1
            if error is None:
                self.ok[index] = True
            else:
                self.errors[index] = error

        return on_delivery

    def acknowledged_prefix(self) -> int:
        """How many leading records were acknowledged: the rows that may be deleted."""
        for index, acknowledged in enumerate(self.ok):
            if not acknowledged:
                return index
        return len(self.ok)


class OutboxRelay:
    """Publishes `identity.outbox` to Kafka; see the module docstring for the guarantees.

    Build with `OutboxRelay.from_settings(...)` or explicit arguments (durations in
    seconds). Drive it with `run(stop)` in its own thread, or `run_once()` from tests. Not
    thread-safe: one thread per instance.
    """

    def __init__(
        self,
        *,
        dsn: str,
        bootstrap: str,
        registry: CollectorRegistry,
        state: ComponentState | None = None,
        heartbeat: Heartbeat | None = None,
        batch_size: int = 2000,
        poll_interval: float = 1.0,
        delivery_timeout: float = 30.0,
        lock_retry_interval: float = LOCK_RETRY_INTERVAL,
        backoff_initial: float = 1.0,
        backoff_maximum: float = 60.0,
        kafka_extra: Mapping[str, ConfigValue] | None = None,
        client_id: str = f"{SERVICE_NAME}-relay",
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        for name, value in (
            ("poll_interval", poll_interval),
            ("delivery_timeout", delivery_timeout),
            ("lock_retry_interval", lock_retry_interval),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self._dsn = dsn
        self._bootstrap = bootstrap
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._delivery_timeout = delivery_timeout
        self._lock_retry_interval = lock_retry_interval
        self._db_backoff = Backoff(initial=backoff_initial, maximum=backoff_maximum)
        self._kafka_backoff = Backoff(initial=backoff_initial, maximum=backoff_maximum)
        self._client_id = client_id
        self._kafka_config: dict[str, ConfigValue] = {
            **(kafka_extra or {}),
            # A dead broker must surface as failed deliveries, not as a flush that never ends.
            "message.timeout.ms": max(1, int(delivery_timeout * 1000)),
        }
        self.metrics = RelayMetrics(registry)
        self.state = state if state is not None else ComponentState()
        self._heartbeat = heartbeat
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(__name__)
        self._application_name = f"{client_id}@{socket.gethostname()}"[:63]
        self._conn: psycopg.Connection[TupleRow] | None = None
        self._holding = False
        self._producer: Producer | None = None
        self._producer_fatal = False
        self._stop = threading.Event()
        self._stop_seen_at: float | None = None
        self._standby_logged = False
        self.last_round: RoundResult | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        registry: CollectorRegistry,
        state: ComponentState | None = None,
        heartbeat: Heartbeat | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> Self:
        return cls(
            dsn=settings.database_dsn.reveal(),
            bootstrap=settings.kafka_bootstrap,
            registry=registry,
            state=state,
            heartbeat=heartbeat,
            batch_size=settings.relay_batch_size,
            poll_interval=settings.relay_poll_interval.total_seconds(),
            delivery_timeout=settings.relay_delivery_timeout.total_seconds(),
            kafka_extra=settings.kafka_security(),
            tracer_provider=tracer_provider,
        )

    @property
    def active(self) -> bool:
        """True while this instance holds the relay lock."""
        return self._holding

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Publish until `stop` is set, then finish the round in flight and release the lock.

        Never raises for PostgreSQL or Kafka outages: it backs off (1 s -> 60 s), reports
        degraded readiness and catches up when they return.
        """
        self._stop = stop
        log_event(_log, "relay started", lockKey=RELAY_LOCK_KEY, batchSize=self._batch_size)
        try:
            while not stop.is_set():
                self._beat()
                try:
                    delay = self._step()
                except Exception as exc:
                    delay = self._failed_round(exc)
                if delay > 0:
                    self._sleep(delay)
        finally:
            self.close()
            log_event(_log, "relay stopped")

    def _step(self) -> float:
        """One round, then the wait it calls for (0: go again at once)."""
        result = self._round()
        self._db_backoff.reset()
        if not result.active:
            return self._lock_retry_interval
        if result.error is not None:
            return self._kafka_backoff.next_delay()
        if result.read:
            self._kafka_backoff.reset()
        if result.read >= self._batch_size:
            return 0.0  # a full batch: more rows are probably waiting
        self._wait_for_notify(self._poll_interval)
        return 0.0

    def _failed_round(self, exc: Exception) -> float:
        retriable = is_retriable(exc)
        delay = self._db_backoff.next_delay()
        reason = f"{type(exc).__name__}: {exc}".strip()
        self.state.degraded(f"postgres: {reason}" if retriable else reason)
        log_event(
            _log,
            "relay round failed",
            logging.WARNING if retriable else logging.ERROR,
            error=reason,
            retriable=retriable,
            retryInSeconds=round(delay, 3),
            **({} if retriable else {"traceback": "".join(traceback.format_exception(exc))}),
        )
        return delay

    def _wait_for_notify(self, timeout: float) -> None:
        """Sleep until a writer's NOTIFY, `timeout` or `stop`, whichever comes first."""
        conn = self._conn
        if conn is None:
            return
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                for _ in conn.notifies(timeout=min(remaining, _WAKE_SLICE), stop_after=1):
                    return
            except Exception:
                self._drop_connection()
                raise
            self._beat()

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self._stop.wait(min(remaining, _WAKE_SLICE)):
                return
            self._beat()

    def _beat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.beat()

    # -- one round ------------------------------------------------------------------------

    def run_once(self) -> int:
        """One round: take the lock if free, publish up to a batch; the rows published.

        Kafka delivery problems are reported (`last_round.error`, metrics, readiness, log),
        not raised; PostgreSQL errors are raised after dropping the connection (and with it
        the lock): the next call reconnects.
        """
        return self._round().published

    def _round(self) -> RoundResult:
        conn = self._connection()
        try:
            if not self._take_lock(conn):
                result = RoundResult(active=False)
                self.state.ok()
            else:
                rows = conn.execute(q.READ_BATCH, {"limit": self._batch_size}).fetchall()
                records = [_record(row) for row in rows]
                result = self._publish(conn, records) if records else RoundResult(active=True)
                if result.error is None:
                    self.state.ok()
                else:
                    self.state.degraded(f"kafka: {result.error}")
            self._refresh_gauges(conn)
        except Exception:
            self._drop_connection()
            raise
        self.last_round = result
        return result

    def _connection(self) -> psycopg.Connection[TupleRow]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        self._drop_connection()
        conn = psycopg.connect(
            self._dsn,
            autocommit=True,  # each statement its own transaction; LISTEN delivers at once
            connect_timeout=5,
            application_name=self._application_name,
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
        )
        try:
            for statement in q.SESSION_SETUP:
                conn.execute(statement)
        except Exception:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _take_lock(self, conn: psycopg.Connection[TupleRow]) -> bool:
        if self._holding:
            return True
        row = conn.execute(q.TRY_LOCK, {"key": RELAY_LOCK_KEY}).fetchone()
        if row is None or not row[0]:
            self.metrics.relay_active.set(0)
            if not self._standby_logged:
                log_event(_log, "relay standby", lockKey=RELAY_LOCK_KEY)
                self._standby_logged = True
            return False
        # LISTEN before the first read: a row committed after the read still wakes us.
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(OUTBOX_CHANNEL)))
        self._holding = True
        self._standby_logged = False
        self.metrics.relay_active.set(1)
        log_event(_log, "relay active", lockKey=RELAY_LOCK_KEY, pid=conn.info.backend_pid)
        return True

    def _publish(self, conn: psycopg.Connection[TupleRow], records: list[_Record]) -> RoundResult:
        producer = self._current_producer()
        acks = _Acks(len(records))
        topics = sorted({r.topic for r in records})
        attributes: dict[str, str | int] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.batch.message_count": len(records),
            "messaging.client.id": self._client_id,
        }
        if len(topics) == 1:  # the conventions omit the destination of a mixed batch
            attributes["messaging.destination.name"] = topics[0]
        name = f"send {topics[0]}" if len(topics) == 1 else "send"
        with self._tracer.start_as_current_span(
            name, kind=SpanKind.PRODUCER, attributes=attributes, links=_links(records)
        ) as span:
            produce_error: str | None = None
            for index, record in enumerate(records):
                try:
                    # Headers go out as stored: their traceparent is the writer's context.
                    producer.produce(
                        record.topic,
                        key=record.key,
                        value=record.value,
                        headers=record.headers,
                        on_delivery=acks.expect(index),
                    )
                except (BufferError, KafkaException) as exc:
                    # Queue full or a fatal producer: stop here; the rest waits for a round.
                    acks.pending -= 1
                    produce_error = f"produce: {exc}"
                    break
            self._flush(producer, acks)
            published = acks.acknowledged_prefix()
            if published:
                ids = [r.id for r in records[:published]]
                deleted = conn.execute(q.DELETE_PUBLISHED, {"ids": ids}).rowcount
                if deleted != published:
                    log_event(
                        _log,
                        "outbox rows already gone",
                        logging.WARNING,
                        expected=published,
                        deleted=deleted,
                    )
            failed = len(records) - sum(acks.ok)
            error = produce_error or _first_error(acks, records)
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, error))
        result = RoundResult(
            active=True,
            read=len(records),
            published=published,
            failed=failed,
            first_id=records[0].id,
            last_published_id=records[published - 1].id if published else None,
            error=error,
        )
        self.metrics.published.inc(published)
        if published:
            log_event(
                _log,
                "outbox published",
                count=published,
                firstId=records[0].id,
                lastId=records[published - 1].id,
                topics=topics,
            )
        if error is not None:
            self.metrics.delivery_failures.inc(max(failed, 1))
            log_event(
                _log,
                "outbox delivery failed",
                logging.WARNING,
                error=error,
                failed=failed,
                published=published,
                firstFailedId=records[published].id if published < len(records) else None,
            )
        return result

    def _flush(self, producer: Producer, acks: _Acks) -> None:
        """Wait for this round's reports, bounded; purge what is still queued afterwards."""
        deadline = time.monotonic() + self._delivery_timeout + FLUSH_MARGIN
        while acks.pending > 0:
            now = time.monotonic()
            if self._stop.is_set():
                self._stop_seen_at = self._stop_seen_at or now
                deadline = min(deadline, self._stop_seen_at + SHUTDOWN_GRACE)
            if now >= deadline:
                break
            producer.flush(min(deadline - now, _WAKE_SLICE))
            self._beat()
        if acks.pending > 0:
            # Not yet sent: drop from the queue so nothing lingers into the next round (those
            # rows stay in the outbox). In-flight requests cannot be recalled; a late ack of
            # one only means a duplicate when its row goes out again.
            producer.purge(in_queue=True, in_flight=False)
            producer.poll(0)

    def _current_producer(self) -> Producer:
        if self._producer is not None and self._producer_fatal:
            # A fatal error (e.g. the idempotent producer fenced) needs a new client.
            log_event(_log, "kafka producer replaced after fatal error", logging.WARNING)
            self._close_producer(0.0)
        if self._producer is None:
            self._producer_fatal = False
            self._producer = create_producer(
                self._bootstrap,
                client_id=self._client_id,
                extra=self._kafka_config,
                on_error=self._on_kafka_error,
            )
        return self._producer

    def _on_kafka_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._producer_fatal = True

    def _refresh_gauges(self, conn: psycopg.Connection[TupleRow]) -> None:
        row = conn.execute(q.BACKLOG, {"exact_up_to": BACKLOG_EXACT_UP_TO}).fetchone()
        if row is None:
            return
        counted, span, _oldest, age = row
        self.metrics.backlog.set(counted if counted < BACKLOG_EXACT_UP_TO else (span or counted))
        self.metrics.oldest_age_seconds.set(max(0.0, age) if age is not None else 0.0)

    # -- teardown -------------------------------------------------------------------------

    def close(self) -> None:
        """Give in-flight deliveries a short grace, release the lock, close both clients."""
        self._close_producer(SHUTDOWN_GRACE)
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                if self._holding:
                    conn.execute(q.UNLOCK, {"key": RELAY_LOCK_KEY})
            except psycopg.Error:
                pass  # closing the connection releases the lock all the same
            finally:
                conn.close()
        self._set_inactive()

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        if self._holding:
            log_event(_log, "relay lock lost", logging.WARNING, lockKey=RELAY_LOCK_KEY)
        self._set_inactive()

    def _set_inactive(self) -> None:
        self._holding = False
        self._standby_logged = False
        self.metrics.relay_active.set(0)

    def _close_producer(self, grace: float) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        if producer.flush(grace) > 0:
            producer.purge(in_queue=True, in_flight=True)
            producer.poll(0)
        producer.close()


def _first_error(acks: _Acks, records: Sequence[_Record]) -> str | None:
    for index, acknowledged in enumerate(acks.ok):
        if acknowledged:
            continue
        error = acks.errors.get(index)
        detail = f"{error.name()}: {error.str()}" if error is not None else "no acknowledgement"
        return f"{detail} (outbox id {records[index].id}, topic {records[index].topic})"
    return None


def _links(records: Sequence[_Record]) -> list[Link]:
    """Links to the transactions that wrote the rows (their stored `traceparent`)."""
    links: list[Link] = []
    seen: set[tuple[int, int]] = set()
    for record in records:
        if not any(name == "traceparent" for name, _ in record.headers):
            continue
        context = trace.get_current_span(extract_context(record.headers)).get_span_context()
        if context.is_valid and (context.trace_id, context.span_id) not in seen:
            seen.add((context.trace_id, context.span_id))
            links.append(Link(context))
            if len(links) >= MAX_SPAN_LINKS:
                break
    return links


def run_relay(
    settings: Settings,
    *,
    registry: CollectorRegistry,
    stop: threading.Event,
    state: ComponentState | None = None,
    heartbeat: Heartbeat | None = None,
) -> None:
    """Run the relay until `stop` is set (the body of both entry points below)."""
    OutboxRelay.from_settings(settings, registry=registry, state=state, heartbeat=heartbeat).run(
        stop
    )


def relay_main(rt: Runtime) -> None:
    """The worker's relay thread: the worker's registry and stop event, readiness "relay".

    No heartbeat: liveness stays the worker loop's, which a busy relay must not mask.
    """
    state = ComponentState()
    rt.ops.add_check("relay", state)
    run_relay(rt.settings, registry=rt.registry, stop=rt.stop, state=state)


def run_relay_process(settings: Settings) -> None:
    """`identity-fanout relay`: the relay alone, with its own ops server, until SIGTERM."""
    from identity_fanout.app import runtime  # noqa: PLC0415 - app imports the worker

    with runtime(settings, "relay") as rt:
        state = ComponentState()
        rt.ops.add_check("relay", state)
        run_relay(settings, registry=rt.registry, stop=rt.stop, state=state, heartbeat=rt.heartbeat)
