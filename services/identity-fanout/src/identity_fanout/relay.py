"""The outbox relay: the service's only publisher, one active instance at a time.

It moves committed rows of `identity.outbox` to Kafka in id order and deletes a row only
after the broker acknowledged it: at-least-once, never loss. A row Kafka refuses for good
(too large, invalid, not authorized) is moved to `identity.outbox_quarantine` in the same
statement that deletes it, so no single row stops the flow. Exactly one instance publishes
(a session advisory lock on the connection that also reads and deletes), which is what keeps
the per-key order the outbox ids give; the others wait as standbys and take over within
`lock_retry_interval` of the holder's connection ending.

The parts, one job each: `LockedSession` (connection, lock, LISTEN), `Publisher` (produce a
round, bounded wait), `settle` (pure: delete, quarantine, or stop), `quarantine` (SQL),
`RelayMetrics`. This module is the loop around them.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Self

import psycopg
from opentelemetry import trace
from prometheus_client import CollectorRegistry
from psycopg.rows import TupleRow

from identity_fanout import relay_queries as q
from identity_fanout.outbox import OUTBOX_CHANNEL
from identity_fanout.quarantine import quarantine_rows
from identity_fanout.relay_metrics import RelayMetrics
from identity_fanout.relay_publisher import Publisher
from identity_fanout.relay_records import OutboxRecord, record_from_row
from identity_fanout.relay_report import refresh_gauges, report_failed_round, report_round
from identity_fanout.relay_session import WAKE_SLICE, LockedSession
from identity_fanout.relay_settlement import settle
from identity_fanout.settings import RELAY_MESSAGE_MAX_BYTES, SERVICE_NAME, Settings
from pin_runtime.backoff import Backoff
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.kafka import Compression, ConfigValue
from pin_runtime.logging import log_event
from pin_runtime.postgres import SessionLimits

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
COMPRESSION: Final[Compression] = "zstd"
"""zstd makes a 20,000-assignment snapshot 6.4x smaller (lz4: 3.5x) for ~40 ms of CPU: the
broker's limit applies to the compressed batch (README "Sizes")."""


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round did; `error` is why it stopped early (a retriable failure), if it did."""

    active: bool
    read: int = 0
    published: int = 0
    failed: int = 0
    """Rows left in the outbox by a stopped round (to be sent again)."""
    quarantined: int = 0
    first_id: int | None = None
    last_published_id: int | None = None
    error: str | None = None


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
        message_max_bytes: int = RELAY_MESSAGE_MAX_BYTES,
        compression: Compression = COMPRESSION,
        kafka_extra: Mapping[str, ConfigValue] | None = None,
        session: SessionLimits | None = None,
        client_id: str = f"{SERVICE_NAME}-relay",
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        _check(batch_size, poll_interval, delivery_timeout, lock_retry_interval)
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._lock_retry_interval = lock_retry_interval
        self._db_backoff = Backoff(initial=backoff_initial, maximum=backoff_maximum)
        self._kafka_backoff = Backoff(initial=backoff_initial, maximum=backoff_maximum)
        self.metrics = RelayMetrics(registry)
        self.state = state if state is not None else ComponentState()
        self._heartbeat = heartbeat
        self._session = LockedSession(
            dsn,
            lock_key=RELAY_LOCK_KEY,
            channel=OUTBOX_CHANNEL,
            application_name=f"{client_id}@{socket.gethostname()}",
            limits=session or SessionLimits(),
            on_active=lambda active: self.metrics.relay_active.set(1 if active else 0),
        )
        self._publisher = Publisher(
            bootstrap=bootstrap,
            client_id=client_id,
            message_max_bytes=message_max_bytes,
            compression=compression,
            extra=kafka_extra,
            delivery_timeout=delivery_timeout,
            tracer=(tracer_provider or trace.get_tracer_provider()).get_tracer(__name__),
        )
        self._stop = threading.Event()
        self._stop_seen_at: float | None = None
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
            message_max_bytes=settings.relay_message_max_bytes,
            kafka_extra=settings.kafka_security(),
            session=settings.database_session(),
            tracer_provider=tracer_provider,
        )

    @property
    def active(self) -> bool:
        """True while this instance holds the relay lock."""
        return self._session.holding

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
        self._session.wait_for_notify(self._poll_interval, stop=self._stop, on_tick=self._beat)
        return 0.0

    def _failed_round(self, exc: Exception) -> float:
        delay = self._db_backoff.next_delay()
        self.state.degraded(report_failed_round(exc, delay))
        return delay

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self._stop.wait(min(remaining, WAKE_SLICE)):
                return
            self._beat()

    def _beat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.beat()

    def _give_up(self) -> bool:
        """During a stop, in-flight deliveries get SHUTDOWN_GRACE more, then the round ends."""
        if not self._stop.is_set():
            return False
        now = time.monotonic()
        self._stop_seen_at = self._stop_seen_at or now
        return now >= self._stop_seen_at + SHUTDOWN_GRACE

    # -- one round ------------------------------------------------------------------------

    def run_once(self) -> int:
        """One round: take the lock if free, publish up to a batch; the rows published.

        Kafka delivery problems are reported (`last_round`, metrics, readiness, log), not
        raised; PostgreSQL errors are raised after dropping the connection (and with it the
        lock): the next call reconnects.
        """
        return self._round().published

    def _round(self) -> RoundResult:
        try:
            conn = self._session.connection()
            if not self._session.acquire():
                result = RoundResult(active=False)
                self.state.ok()
            else:
                rows = conn.execute(q.READ_BATCH, {"limit": self._batch_size}).fetchall()
                records = [record_from_row(row) for row in rows]
                result = self._publish(conn, records) if records else RoundResult(active=True)
                if result.error is None:
                    self.state.ok()
                else:
                    self.state.degraded(f"kafka: {result.error}")
            refresh_gauges(conn, self.metrics)
        except Exception:
            self._session.drop()
            raise
        self.last_round = result
        return result

    def _publish(
        self, conn: psycopg.Connection[TupleRow], records: list[OutboxRecord]
    ) -> RoundResult:
        tracker = self._publisher.publish(records, on_tick=self._beat, give_up=self._give_up)
        settlement = settle(records, tracker.acknowledged, tracker.failures)
        _delete_published(conn, settlement.delete)
        moved = quarantine_rows(conn, settlement.quarantine)
        report_round(self.metrics, records, settlement, moved)
        return RoundResult(
            active=True,
            read=len(records),
            published=len(settlement.delete),
            failed=settlement.waiting,
            quarantined=len(moved),
            first_id=records[0].id,
            last_published_id=max(settlement.delete) if settlement.delete else None,
            error=settlement.stop_reason(),
        )

    # -- teardown -------------------------------------------------------------------------

    def close(self) -> None:
        """Give in-flight deliveries a short grace, release the lock, close both clients."""
        self._publisher.close(SHUTDOWN_GRACE)
        self._session.close()


def _delete_published(conn: psycopg.Connection[TupleRow], ids: Sequence[int]) -> None:
    if not ids:
        return
    deleted = conn.execute(q.DELETE_PUBLISHED, {"ids": list(ids)}).rowcount
    if deleted != len(ids):
        log_event(
            _log, "outbox rows already gone", logging.WARNING, expected=len(ids), deleted=deleted
        )


def _check(
    batch_size: int, poll_interval: float, delivery_timeout: float, lock_retry_interval: float
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
