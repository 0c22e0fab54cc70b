"""The outbox relay: the service's only publisher, any number of instances at once.

It moves committed rows of the outbox (the service's `OutboxTables`) to Kafka and deletes a
row only after the broker acknowledged it: at-least-once, never loss. A row Kafka refuses for
good (too large, invalid, not authorized) is moved to the quarantine in the same statement
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

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Final, Self

import msgspec
import psycopg
from opentelemetry import trace
from prometheus_client import CollectorRegistry
from psycopg.rows import TupleRow

from identity_fanout.outbox import log as _log
from identity_fanout.outbox.lanes import DEFAULT_LANES, MAX_LANES
from identity_fanout.outbox.metrics import RelayMetrics
from identity_fanout.outbox.partitions import catalogue_partitions
from identity_fanout.outbox.pause import Pause, next_pause
from identity_fanout.outbox.publisher import Publisher
from identity_fanout.outbox.pump import (
    READ_COOLDOWN,
    SHUTDOWN_GRACE,
    Deleter,
    Pump,
    RoundResult,
)
from identity_fanout.outbox.report import Gauges, report_failed_round, report_pause
from identity_fanout.outbox.session import WAKE_SLICE, LaneSession
from identity_fanout.outbox.tables import OutboxTables
from identity_fanout.outbox.window import (
    DEFAULT_WINDOW_BYTES,
    DEFAULT_WINDOW_RECORDS,
    InflightWindow,
)
from pin_runtime.backoff import Backoff
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.kafka import Compression, ConfigValue
from pin_runtime.logging import log_event
from pin_runtime.postgres import SessionLimits, connect

__all__ = [
    "DEFAULT_LANES",
    "OutboxRelay",
    "RelayConfig",
    "RelayMetrics",
    "RelaySignals",
    "RoundResult",
]


LOCK_RETRY_INTERVAL: Final = 2.0
"""Seconds between an instance's looks at the lanes: its take-over and hand-over delay."""
GAUGES_INTERVAL: Final = 2.0
"""Seconds between an instance's refreshes of the backlog gauges, times the instances
running: every instance reports the whole outbox, so the fleet counts it once per this
interval however many run (docs/design/identity-fanout.md "Relays side by side")."""
COMPRESSION: Final[Compression] = "zstd"
"""zstd makes a 20,000-assignment snapshot 6.4x smaller (lz4: 3.5x) for ~40 ms of CPU: the
broker's limit applies to the compressed batch (docs/design/identity-fanout.md "Sizes")."""


@dataclass(eq=False)
class Rounds:
    """The rhythm of the relay's rounds: when it looks at the lanes again, and how a round ends.

    A round starts with the connection and, every `lock_retry_interval` (or when forced), a
    look at the lanes (rebalance); it ends with the pump's tally taken, the backlog gauges
    refreshed when due (at the first round, after a quarantine, and every `GAUGES_INTERVAL`
    times the instances running), the pause for a refusal
    of the cluster decided (`pause.next_pause`) and reported on a change, readiness set
    from the round's outcome and the result kept as `last_round`.
    """

    session: LaneSession
    pump: Pump
    metrics: RelayMetrics
    gauges: Gauges
    state: ComponentState
    _: KW_ONLY
    look_interval: float
    _next_look: float = field(init=False, default=0.0)
    _refreshed_at: float | None = field(init=False, default=None)
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
        return conn

    def blind(self) -> None:
        """The database failed the round: the gauges read from it are unknown (NaN) until
        the next round that reaches it refreshes them, at once."""
        self._refreshed_at = None
        self.metrics.set_unknown()

    def finish(self, conn: psycopg.Connection[TupleRow]) -> RoundResult:
        idle = not self.pump.tally.read and not len(self.pump.window)
        if idle:
            self.pump.flush()  # nothing else to do: the last deletes
        result = self.pump.take_tally()
        # After the step (the backlog it left): at the first round, on a quarantine, and
        # every GAUGES_INTERVAL times the instances running. Every instance counts the
        # whole outbox (any one of them shows it, and a stuck one cannot hide the others'
        # backlog), so a fixed interval per instance made the counts grow with the
        # instances: with 8 they were the relays' costliest statement in a drain, 10-40 ms
        # each over the dead rows at the outbox's head (docs/design/identity-fanout.md
        # "Relays side by side").
        # The floor the next reads from a lane's head and the gauges start at (a step every
        # FLOOR_INTERVAL at most: outbox.floor).
        floor = self.pump.floor.refresh(conn)
        now = time.monotonic()
        interval = GAUGES_INTERVAL * self.session.instances
        if self._refreshed_at is None or result.quarantined or now - self._refreshed_at >= interval:
            self._refreshed_at = now
            self.gauges.refresh(conn, floor)
        result.active = bool(self.session.lanes)
        # Only a read that found nothing shows that nothing waits: a step inside a read's
        # cooldown did not look.
        looked_idle = idle and not self.pump.cooldown_left()
        before, self.pause = (
            self.pause,
            next_pause(
                self.pause, result.refused, acknowledged=result.acknowledged, idle=looked_idle
            ),
        )
        report_pause(self.metrics, before, self.pause)
        if self.pause is not before:
            pause = self.pause
            self.session.mark_pause(
                None if pause is None else pause.failure.reason,
                None if pause is None else pause.topic,
            )
        if self.pause is not None:
            self.state.degraded(f"kafka: {self.pause.describe()}")
        elif result.error is None:
            self.state.ok()
        else:
            self.state.degraded(f"kafka: {result.error}")
        self.last_round = result
        return result


class RelayConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one relay instance is configured with, durations in seconds.

    The service builds it from its settings (`identity_fanout.app.relay_config`); a test or a
    benchmark builds it directly. Checked on construction: a bad value never reaches a loop.
    """

    dsn: str
    bootstrap: str
    tables: OutboxTables
    """Where the outbox lives and what the relay must know of its events (the service's)."""
    client_id: str
    """The producer's client.id, and the prefix of the sessions' application_name."""
    lanes: int = DEFAULT_LANES
    batch_size: int = 5000
    """Rows per read (and per delete), within what is left of the window."""
    window_records: int = DEFAULT_WINDOW_RECORDS
    window_bytes: int = DEFAULT_WINDOW_BYTES
    poll_interval: float = 1.0
    """How often the outbox is looked at when no NOTIFY came."""
    read_cooldown: float = READ_COOLDOWN
    """After a read that found the lanes caught up, how long before the next read
    (`Pump.cycle`); 0: none."""
    delivery_timeout: float = 30.0
    lock_retry_interval: float = LOCK_RETRY_INTERVAL
    backoff_initial: float = 1.0
    backoff_maximum: float = 60.0
    message_max_bytes: int = 1_000_000
    """The producer's `message.max.bytes`: a larger row is quarantined at once."""
    compression: Compression = COMPRESSION
    kafka_extra: dict[str, ConfigValue] = msgspec.field(default_factory=dict)
    """More producer properties: the cluster's security settings."""
    session: SessionLimits = msgspec.field(default_factory=SessionLimits)
    partitions: dict[str, int] = msgspec.field(default_factory=catalogue_partitions)
    """The topic catalogue's partition count per topic: each record's partition is its key's
    by this count (`outbox.partitions`), whatever the cluster has."""

    def __post_init__(self) -> None:
        if not 1 <= self.lanes <= MAX_LANES:
            raise ValueError(f"lanes must be within 1..{MAX_LANES}, got {self.lanes}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        for name in ("poll_interval", "delivery_timeout", "lock_retry_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.read_cooldown < 0:
            raise ValueError(f"read_cooldown must be >= 0, got {self.read_cooldown}")


@dataclass(frozen=True)
class RelaySignals:
    """Where a test watches a relay; a service leaves them unset."""

    probe: Callable[[str, int], None] | None = None
    """`probe(event, lane or slot)`: "acquired", "releasing", "lost" of a lane
    (`LaneSession`), "produced", "settled" of a slot (`Pump`)."""


class OutboxRelay:
    """Publishes its lanes of the outbox to Kafka; see the module docstring.

    Drive it with `run(stop)` in its own thread (pipelined), or `run_once()` from tests
    (one batch, waited for). Not thread-safe: one thread per instance.
    """

    def __init__(
        self,
        config: RelayConfig,
        *,
        registry: CollectorRegistry,
        state: ComponentState | None = None,
        heartbeat: Heartbeat | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        signals: RelaySignals | None = None,
    ) -> None:
        probe = (signals or RelaySignals()).probe
        self.config = config
        self._db_backoff = Backoff(initial=config.backoff_initial, maximum=config.backoff_maximum)
        self._kafka_backoff = Backoff(
            initial=config.backoff_initial, maximum=config.backoff_maximum
        )
        self.metrics = RelayMetrics(registry)
        self.state = state if state is not None else ComponentState()
        host = socket.gethostname()
        self._session = LaneSession(
            config.dsn,
            lanes=config.lanes,
            tables=config.tables,
            application_name=f"{config.client_id}@{host}",
            limits=config.session,
            on_change=self.metrics.set_lanes,
            on_foreign=self.metrics.foreign_lock_holders.set,
            probe=probe,
        )
        # The deleter's own autocommit sessions, named apart from the lanes' session.
        delete_name = f"{config.client_id}-delete@{host}"
        self._pump = Pump(
            Publisher(
                bootstrap=config.bootstrap,
                client_id=config.client_id,
                message_max_bytes=config.message_max_bytes,
                compression=config.compression,
                extra=config.kafka_extra,
                delivery_timeout=config.delivery_timeout,
                tracer=(tracer_provider or trace.get_tracer_provider()).get_tracer(__name__),
                partitions=config.partitions,
                on_partitions=self.metrics.set_topic_partitions,
            ),
            InflightWindow(max_records=config.window_records, max_bytes=config.window_bytes),
            self.metrics,
            Deleter(
                lambda: connect(config.dsn, config.session, application_name=delete_name),
                self.metrics,
                config.tables,
            ),
            tables=config.tables,
            lanes=config.lanes,
            batch_size=config.batch_size,
            delivery_timeout=config.delivery_timeout,
            read_cooldown=config.read_cooldown,
            probe=probe,
        )
        self._pace = Pacer(heartbeat)
        self._rounds = Rounds(
            self._session,
            self._pump,
            self.metrics,
            Gauges(self.metrics, self._pump.quarantine),
            self.state,
            look_interval=config.lock_retry_interval,
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
        log_event(_log, "relay started", batchSize=self.config.batch_size)
        try:
            while not stop.is_set():
                self._pace.beat()
                try:
                    delay = self._guarded(self._step)
                except Exception as exc:
                    delay = self._db_backoff.next_delay()
                    self.state.degraded(
                        report_failed_round(self.metrics, exc, delay, dsn=self.config.dsn)
                    )
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
            return self.config.lock_retry_interval
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
                self.config.poll_interval, stop=self._pace.stop, on_tick=self._pace.beat
            )
            # Woken while the lanes cool down after a caught-up read: the next read waits
            # for the end of it, and answers every commit until then.
            return self._pump.cooldown_left()
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
            self._rounds.blind()
            raise

    def close(self) -> None:
        """Settle what is in flight (short grace), give back the lanes, close the clients."""
        self._pump.stop(self._session.connection if self._session.lanes else None)
        self._session.close()


# -- pacing --------------------------------------------------------------------------------

# The relay loop's waits: interruptible sleeps, the liveness heartbeat, the stop grace.


class Pacer:
    """Sleeps that end at a stop request and beat the heartbeat (if any) meanwhile."""

    def __init__(self, heartbeat: Heartbeat | None) -> None:
        self._heartbeat = heartbeat
        self.stop = threading.Event()
        self._stop_seen_at: float | None = None

    def beat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.beat()

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self.stop.wait(min(remaining, WAKE_SLICE)):
                return
            self.beat()

    def give_up(self) -> bool:
        """During a stop, in-flight deliveries get SHUTDOWN_GRACE more, then waits end."""
        if not self.stop.is_set():
            return False
        now = time.monotonic()
        self._stop_seen_at = self._stop_seen_at or now
        return now >= self._stop_seen_at + SHUTDOWN_GRACE
