"""The outbox relay: the service's only publisher, any number of instances at once.

It moves committed rows of `identity.outbox` to Kafka and deletes a row only after the
broker acknowledged it: at-least-once, never loss. A row Kafka refuses for good (too large,
invalid, not authorized) is moved to `identity.outbox_quarantine` in the same statement
that deletes it, so no single row stops the flow.

The outbox is split into lanes by message key (`lanes`); each instance holds the advisory
locks of its share of the lanes and publishes only those, in outbox id order, so the rows of
one key keep their order and have one publisher at a time. A dead instance's lanes (its
locks end with its connection) are taken by the others within `lock_retry_interval` of the
server noticing. Within its lanes an instance keeps producing while acknowledgements are
pending, up to a bounded in-flight window, and deletes acknowledged prefixes in batches.

The parts, one job each: `LaneSession` (connection, lane locks, balancing, LISTEN),
`Rounds` (when to look at the lanes again, how a round ends),
`Pump` (read, produce, settle, delete: the pipelined flow), `InflightWindow` (pure window
accounting), `Publisher` (the producer), `settle` (pure: delete, quarantine, or stop),
`quarantine` (SQL), `RelayMetrics`. This module is the loop around them.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Final, Self

import psycopg
from opentelemetry import trace
from prometheus_client import CollectorRegistry
from psycopg.rows import TupleRow

from identity_fanout.channels import OUTBOX_CHANNEL
from identity_fanout.outbox.deleter import Deleter
from identity_fanout.outbox.lanes import DEFAULT_LANES, MAX_LANES
from identity_fanout.outbox.log import log as _log
from identity_fanout.outbox.metrics import RelayMetrics
from identity_fanout.outbox.pacing import Pacer
from identity_fanout.outbox.pause import Pause, next_pause
from identity_fanout.outbox.publisher import Publisher
from identity_fanout.outbox.pump import Pump, RoundResult
from identity_fanout.outbox.report import refresh_gauges, report_failed_round, report_pause
from identity_fanout.outbox.session import LaneSession
from identity_fanout.outbox.window import (
    DEFAULT_WINDOW_BYTES,
    DEFAULT_WINDOW_RECORDS,
    InflightWindow,
)
from identity_fanout.settings import RELAY_MESSAGE_MAX_BYTES, SERVICE_NAME, Settings
from pin_runtime.backoff import Backoff
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.kafka import Compression, ConfigValue
from pin_runtime.logging import log_event
from pin_runtime.postgres import SessionLimits, connect

__all__ = [
    "DEFAULT_LANES",
    "OutboxRelay",
    "RelayMetrics",
    "RoundResult",
    "relay_from_settings",
    "run_relay",
    "tune_relay_gc",
]


LOCK_RETRY_INTERVAL: Final = 2.0
"""Seconds between an instance's looks at the lanes: its take-over and hand-over delay."""
COMPRESSION: Final[Compression] = "zstd"
"""zstd makes a 20,000-assignment snapshot 6.4x smaller (lz4: 3.5x) for ~40 ms of CPU: the
broker's limit applies to the compressed batch (docs/design/identity-fanout.md "Sizes")."""


@dataclass(eq=False)
class Rounds:
    """The rhythm of the relay's rounds: when it looks at the lanes again, and how a round ends.

    A round starts with the connection and, every `lock_retry_interval` (or when forced), a
    look at the lanes (rebalance); it ends with the pump's tally taken, the backlog gauges
    refreshed when due (at each look, after a quarantine, when idle), the pause for a refusal
    of the cluster decided (`pause.next_pause`) and reported on a change, readiness set
    from the round's outcome and the result kept as `last_round`.
    """

    session: LaneSession
    pump: Pump
    metrics: RelayMetrics
    state: ComponentState
    _: KW_ONLY
    look_interval: float
    _next_look: float = field(init=False, default=0.0)
    _gauges_due: bool = field(init=False, default=False)
    last_round: RoundResult | None = field(init=False, default=None)
    pause: Pause | None = field(init=False, default=None)
    """The refusal of the cluster the relay waits out now (None: not paused)."""

    def start(self, *, force: bool) -> psycopg.Connection[TupleRow]:
        """The connection; every `look_interval` (or if forced) also the lanes and gauges."""
        conn = self.session.connection()
        now = time.monotonic()
        if force or now >= self._next_look:
            self._next_look = now + self.look_interval
            self.session.rebalance()
            self._gauges_due = True
        return conn

    def finish(self, conn: psycopg.Connection[TupleRow]) -> RoundResult:
        idle = not self.pump.tally.read and not len(self.pump.window)
        if idle:
            self.pump.flush()  # nothing else to do: the last deletes, then the gauges
        result = self.pump.take_tally()
        # After the step (the backlog it left): at each look, on a quarantine, when idle.
        if self._gauges_due or result.quarantined or idle:
            self._gauges_due = False
            refresh_gauges(conn, self.metrics)
        result.active = bool(self.session.lanes)
        before, self.pause = (
            self.pause,
            next_pause(self.pause, result.refused, acknowledged=result.acknowledged, idle=idle),
        )
        report_pause(self.metrics, before, self.pause)
        if self.pause is not None:
            self.state.degraded(f"kafka: {self.pause.describe()}")
        elif result.error is None:
            self.state.ok()
        else:
            self.state.degraded(f"kafka: {result.error}")
        self.last_round = result
        return result


class OutboxRelay:
    """Publishes its lanes of `identity.outbox` to Kafka; see the module docstring.

    Build with `relay_from_settings(...)` or explicit arguments (durations in
    seconds). Drive it with `run(stop)` in its own thread (pipelined), or `run_once()` from
    tests (one batch, waited for). Not thread-safe: one thread per instance.
    """

    def __init__(
        self,
        *,
        dsn: str,
        bootstrap: str,
        registry: CollectorRegistry,
        state: ComponentState | None = None,
        heartbeat: Heartbeat | None = None,
        lanes: int = DEFAULT_LANES,
        batch_size: int = 5000,
        window_records: int = DEFAULT_WINDOW_RECORDS,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
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
        probe: Callable[[str, int], None] | None = None,
    ) -> None:
        _check(lanes, batch_size, poll_interval, delivery_timeout, lock_retry_interval)
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._lock_retry_interval = lock_retry_interval
        self._db_backoff = Backoff(initial=backoff_initial, maximum=backoff_maximum)
        self._kafka_backoff = Backoff(initial=backoff_initial, maximum=backoff_maximum)
        self.metrics = RelayMetrics(registry)
        self.state = state if state is not None else ComponentState()
        limits = session or SessionLimits()
        self._session = LaneSession(
            dsn,
            lanes=lanes,
            channel=OUTBOX_CHANNEL,
            application_name=f"{client_id}@{socket.gethostname()}",
            limits=limits,
            on_change=self.metrics.set_lanes,
            on_foreign=self.metrics.foreign_lock_holders.set,
            probe=probe,
        )
        self._pump = Pump(
            Publisher(
                bootstrap=bootstrap,
                client_id=client_id,
                message_max_bytes=message_max_bytes,
                compression=compression,
                extra=kafka_extra,
                delivery_timeout=delivery_timeout,
                tracer=(tracer_provider or trace.get_tracer_provider()).get_tracer(__name__),
            ),
            InflightWindow(max_records=window_records, max_bytes=window_bytes),
            self.metrics,
            Deleter(_connector(dsn, f"{client_id}-delete", limits), self.metrics),
            lanes=lanes,
            batch_size=batch_size,
            delivery_timeout=delivery_timeout,
            probe=probe,
        )
        self._pace = Pacer(heartbeat)
        self._rounds = Rounds(
            self._session, self._pump, self.metrics, self.state, look_interval=lock_retry_interval
        )

    @property
    def last_round(self) -> RoundResult | None:
        """What the last round did (published, quarantined, the Kafka error that stopped it)."""
        return self._rounds.last_round

    @property
    def pause(self) -> Pause | None:
        """The refusal of the cluster this instance waits out (None: not paused)."""
        return self._rounds.pause

    @property
    def active(self) -> bool:
        """True while this instance holds at least one lane."""
        return bool(self._session.lanes)

    @property
    def lanes(self) -> frozenset[int]:
        return self._session.lanes

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def run(self, stop: threading.Event) -> None:
        """Publish until `stop` is set, then settle what is in flight and give back the lanes.

        Never raises for PostgreSQL or Kafka outages: it backs off (1 s -> 60 s), reports
        degraded readiness and catches up when they return.
        """
        self._pace.stop = stop
        log_event(_log, "relay started", batchSize=self._batch_size)
        try:
            while not stop.is_set():
                self._pace.beat()
                try:
                    delay = self._guarded(self._step)
                except Exception as exc:
                    delay = self._db_backoff.next_delay()
                    self.state.degraded(report_failed_round(exc, delay))
                if delay > 0:
                    self._pace.sleep(delay)
        finally:
            self.close()
            log_event(_log, "relay stopped")

    def run_once(self) -> int:
        """Look at the lanes, publish up to a batch of them and wait for it; rows published.

        Kafka delivery problems are reported (`last_round`, metrics, readiness, log), not
        raised; PostgreSQL errors are raised after dropping the connection (and with it the
        lanes): the next call reconnects.
        """

        def once() -> float:
            conn = self._rounds.start(force=True)
            if self.active:
                self._pump.fill(conn, self._session.readable_lanes())
                self._pump.drain(conn, self._pace.beat, self._pace.give_up)
                self._pump.flush()
                self._release_idle(conn)
            self._rounds.finish(conn)
            return 0.0

        self._guarded(once)
        return self.last_round.published if self.last_round else 0

    def _step(self) -> float:
        """One turn of the pipelined flow, then the wait it calls for (0: go on at once)."""
        conn = self._rounds.start(force=False)
        if not self.active:
            self._rounds.finish(conn)
            return self._lock_retry_interval
        read = self._pump.cycle(
            conn,
            self._session.readable_lanes(),
            on_tick=self._pace.beat,
            give_up=self._pace.give_up,
        )
        self._release_idle(conn)
        result = self._rounds.finish(conn)
        self._db_backoff.reset()
        if result.error is not None:
            return self._kafka_backoff.next_delay()
        if read and self._rounds.pause is None:
            # Paused, a read is only the next try: the delay grows until Kafka takes a row.
            self._kafka_backoff.reset()
        elif not len(self._pump.window):
            self._session.wait_for_notify(
                self._poll_interval, stop=self._pace.stop, on_tick=self._pace.beat
            )
        return 0.0

    def _release_idle(self, conn: psycopg.Connection[TupleRow]) -> None:
        """Hand over the surplus lanes with nothing in flight (their acks deleted first, so
        the next holder does not send them again)."""
        if self._session.handing_over and self._pump.flush():
            self._session.release_idle(self._pump.window.busy_slots())

    def _guarded(self, step: Callable[[], float]) -> float:
        """Any database error: drop the connection (and the lanes) and forget the window."""
        try:
            return step()
        except Exception:
            self._session.drop()
            self._pump.forget()
            raise

    def close(self) -> None:
        """Settle what is in flight (short grace), give back the lanes, close the clients."""
        self._pump.stop(self._session.connection if self._session.lanes else None)
        self._session.close()


GC_THRESHOLD: Final = (100_000, 50, 100)
"""The relay process's collector thresholds (Python's: 700, 10, 10). The relay makes tens
of thousands of short-lived objects per second (rows, records, delivery callbacks) and holds
a window of them: with the default, the collector ran every 700 allocations and walked the
window again and again, a third of the relay's CPU (bench/relay: 1.4 s -> 1.0 s of CPU for
50,000 rows). Its objects form no cycles to speak of; garbage in cycles waits a little
longer, bounded by the 100,000 allocations."""


def tune_relay_gc() -> None:
    """For the relay's own process only (`identity-fanout relay`), never the worker's."""
    gc.freeze()  # what start-up made is permanent: never walked again
    gc.set_threshold(*GC_THRESHOLD)


def _connector(
    dsn: str, name: str, limits: SessionLimits
) -> Callable[[], psycopg.Connection[TupleRow]]:
    """Connections of the deleter: autocommit, the service's session limits."""
    return lambda: connect(dsn, limits, application_name=f"{name}@{socket.gethostname()}")


def _options(settings: Settings) -> dict[str, Any]:
    """`OutboxRelay` arguments from the service's settings."""
    return {
        "dsn": settings.database_dsn.reveal(),
        "bootstrap": settings.kafka_bootstrap,
        "lanes": settings.outbox_lanes,
        "batch_size": settings.relay_batch_size,
        "window_records": settings.relay_window_records,
        "window_bytes": settings.relay_window_bytes,
        "poll_interval": settings.relay_poll_interval.total_seconds(),
        "delivery_timeout": settings.relay_delivery_timeout.total_seconds(),
        "message_max_bytes": settings.relay_message_max_bytes,
        "kafka_extra": settings.kafka_security(),
        "session": settings.database_session(),
    }


def _check(
    lanes: int,
    batch_size: int,
    poll_interval: float,
    delivery_timeout: float,
    lock_retry_interval: float,
) -> None:
    if not 1 <= lanes <= MAX_LANES:
        raise ValueError(f"lanes must be within 1..{MAX_LANES}, got {lanes}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for name, value in (
        ("poll_interval", poll_interval),
        ("delivery_timeout", delivery_timeout),
        ("lock_retry_interval", lock_retry_interval),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")


def relay_from_settings(
    settings: Settings,
    *,
    registry: CollectorRegistry,
    state: ComponentState | None = None,
    heartbeat: Heartbeat | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> OutboxRelay:
    """The relay the service's settings describe (what both entry points run)."""
    return OutboxRelay(
        **_options(settings),
        registry=registry,
        state=state,
        heartbeat=heartbeat,
        tracer_provider=tracer_provider,
    )


def run_relay(
    settings: Settings,
    *,
    registry: CollectorRegistry,
    stop: threading.Event,
    state: ComponentState | None = None,
    heartbeat: Heartbeat | None = None,
) -> None:
    """Run the relay until `stop` is set (the body of both entry points below)."""
    relay_from_settings(settings, registry=registry, state=state, heartbeat=heartbeat).run(stop)
