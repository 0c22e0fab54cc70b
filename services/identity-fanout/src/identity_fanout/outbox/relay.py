"""The outbox relay: the service's only publisher, any number of instances at once.

It moves committed rows of the outbox (the service's `OutboxTables`) to Kafka and deletes a
row only after the broker acknowledged it: at-least-once, never loss. A row Kafka refuses for
good (too large, invalid, not authorized) is moved to the quarantine in the same statement
that deletes it, so no single row stops the flow.

The outbox is split into lanes by message key (`rules`, `outbox_lanes` of them); each
instance holds the advisory locks of its share of the lanes (`LaneSession`) and publishes
only those, in outbox id order, so the rows of one key keep their order and have one
publisher at a time. A dead instance's lanes (its locks end with its connection) are taken
by the others within `lock_retry_interval` of the server noticing.

One loop on one thread does everything, one round after the other (`OutboxRelay._round`):

1. start: the lanes' connection, and every `lock_retry_interval` a look at the lanes;
2. read the next rows of the held lanes (id order, each slot after the last one read and up
   to its frontier, within what is left of the in-flight window) and produce them at once;
3. poll: serve the producer's delivery reports (the window keeps every record's outcome);
4. settle the window's settled prefix (`rules.settle`): quarantine the rows refused for
   good, delete the acknowledged ones once a batch of them is there (or the lanes caught
   up); a retriable failure, or a record without an outcome past the delivery timeout,
   stops the flow (`_fail`): every outstanding record gets its outcome (bounded wait), the
   settled prefix is applied and the rest stays in the outbox to go out again after a
   backoff, so a later row of a key never overtakes one that may yet be delivered;
5. finish: the floor, the age of the oldest open writer of a held slot (from the frontier's
   steps), the backlog gauges when due, the pause for a refusal of the cluster
   (`rules.next_pause`), readiness; then wait for a NOTIFY if nothing is in flight (or for
   a writer of a held slot to end, which a rollback does not announce).

The reads and deletes run on the lanes' own connection, between produce calls, and no
thread of the relay's own: librdkafka sends and compresses on its threads meanwhile
(docs/design/identity-fanout.md "Outbox relay" says what threads of the relay's own and a
pipelined read ahead were measured to buy, and what the one thread costs).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Final, Self

import msgspec
import psycopg
from opentelemetry import trace
from prometheus_client import CollectorRegistry
from psycopg import errors
from psycopg.rows import TupleRow

from identity_fanout.outbox.frontier import OutboxFrontier
from identity_fanout.outbox.metrics import RelayMetrics
from identity_fanout.outbox.partitions import catalogue_partitions
from identity_fanout.outbox.pause_mark import session_name
from identity_fanout.outbox.publisher import FLUSH_MARGIN, Publisher
from identity_fanout.outbox.records import MAX_SPAN_LINKS, OutboxRecord
from identity_fanout.outbox.report import (
    report_failed_round,
    report_pause,
    report_published,
    report_refusals,
    report_stopped,
)
from identity_fanout.outbox.rules import (
    DEFAULT_LANES,
    ForeignHolder,
    Pause,
    Refusal,
    Settlement,
    foreign_holders,
    next_pause,
    plan_lanes,
    refusal_of,
    relay_instances,
    slots_of,
)
from identity_fanout.outbox.settings import RelaySettings
from identity_fanout.outbox.store import OutboxStore, ReadRequest
from identity_fanout.outbox.tables import OutboxTables
from identity_fanout.outbox.window import InflightWindow, ProducedTrace
from pin_runtime.backoff import Backoff
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.kafka import Compression
from pin_runtime.logging import log_event
from pin_runtime.postgres import LazyConnection, SessionLimits, connect

__all__ = [
    "DEFAULT_LANES",
    "DELETE_SPAN",
    "OutboxRelay",
    "RelayInternals",
    "RelayMetrics",
    "RelaySignals",
    "RoundResult",
]

_log = logging.getLogger(__name__)

Conn = psycopg.Connection[TupleRow]
Probe = Callable[[str, int], None]
"""`probe(event, lane or slot)`: "acquired", "releasing", "lost" of a lane, "produced" before
rows of a slot are produced, "settled" after some were settled. For tests."""

LOCK_RETRY_INTERVAL: Final = 2.0
"""Seconds between an instance's looks at the lanes: its take-over and hand-over delay."""
GAUGES_INTERVAL: Final = 2.0
"""Seconds between an instance's refreshes of the backlog gauges, times the instances
running: every instance reports the whole outbox, so the fleet counts it once per this
interval however many run (docs/design/identity-fanout.md "Outbox relay")."""
COMPRESSION: Final[Compression] = "zstd"
"""The broker's limit applies to the compressed batch, and zstd makes the large snapshots
the smallest for little CPU (docs/design/identity-fanout.md "Sizes")."""
SHUTDOWN_GRACE: Final = 5.0
"""On stop, how long in-flight deliveries may still take before the relay gives up on them
(they stay in the outbox and go out again later)."""
BUSY_WAIT: Final = 0.05
"""How long to wait for reports when the window is full or nothing new was read."""
WAKE_SLICE: Final = 0.5
"""Longest uninterruptible wait: bounds the reaction to a stop request."""
FRONTIER_RECHECK: Final = 0.1
"""Longest wait for a NOTIFY while a writer of a held slot is open: its rollback (or a
prepared transaction's end) wakes nobody, and rows committed behind it wait for the next
look at the frontier."""
DELETE_SPAN: Final = "delete_published identity.outbox"
"""The span of a delete of published rows (database conventions: `{db.query.summary}`),
linked to the sends of its rows; `outbox published` is logged in it."""

_VALUE = attrgetter("value")
_SLOT = attrgetter("slot")
_ID = attrgetter("id")


class RelayInternals(msgspec.Struct, frozen=True, kw_only=True):
    """What a relay is built with besides its settings (`RelaySettings`) that no operator
    sets: the service leaves the defaults, a test shortens the waits. Durations in seconds."""

    lock_retry_interval: float = LOCK_RETRY_INTERVAL
    backoff_initial: float = 1.0
    backoff_maximum: float = 60.0
    compression: Compression = COMPRESSION
    partitions: dict[str, int] = msgspec.field(default_factory=catalogue_partitions)
    """The topic catalogue's partition count per topic: each record's partition is its key's
    by this count (`outbox.partitions`), whatever the cluster has."""

    def __post_init__(self) -> None:
        if self.lock_retry_interval <= 0:
            raise ValueError(f"lock_retry_interval must be > 0, got {self.lock_retry_interval}")


@dataclass(frozen=True)
class RelaySignals:
    """Where a test watches a relay; a service leaves them unset."""

    probe: Probe | None = None


@dataclass(slots=True)
class RoundResult:
    """What one round did. Counted into while the round runs; `active` is set at its end and
    nothing changes it afterwards. `error` is why the flow stopped (a retriable failure), if
    it did."""

    active: bool = False
    read: int = 0
    published: int = 0
    failed: int = 0
    """Rows left in the outbox by a stopped flow (to be sent again)."""
    quarantined: int = 0
    first_id: int | None = None
    last_published_id: int | None = None
    error: str | None = None
    refused: Pause | None = None
    """The flow stopped on a refusal of the cluster (`rules.next_pause`): `error` says it too."""
    acknowledged: set[str] = field(default_factory=set)
    """Topics of rows the broker acknowledged in this round (what lifts a pause)."""


class OutboxRelay:
    """Publishes its lanes of the outbox to Kafka; see the module docstring.

    Drive it with `run(stop)` in its own thread, or `run_once()` from tests (one batch,
    waited for). Not thread-safe: one thread per instance.
    """

    def __init__(
        self,
        settings: RelaySettings,
        *,
        tables: OutboxTables,
        client_id: str,
        registry: CollectorRegistry,
        state: ComponentState | None = None,
        heartbeat: Heartbeat | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        signals: RelaySignals | None = None,
        internals: RelayInternals | None = None,
    ) -> None:
        """`tables`: where the outbox lives and what the relay must know of its events (the
        service's); `client_id`: the producer's client.id, and the prefix of the sessions'
        application_name."""
        self.settings = settings
        internals = internals or RelayInternals()
        self._tables = tables
        self._dsn = settings.database_dsn.reveal()
        self._poll_interval = settings.relay_poll_interval.total_seconds()
        self._read_cooldown = settings.relay_read_cooldown.total_seconds()
        self._lock_retry_interval = internals.lock_retry_interval
        self._probe = (signals or RelaySignals()).probe
        self._store = OutboxStore(tables)
        self.metrics = RelayMetrics(registry)
        self.state = state if state is not None else ComponentState()
        self._heartbeat = heartbeat
        self._stop = threading.Event()
        self._stop_seen_at: float | None = None
        self._db_backoff = Backoff(
            initial=internals.backoff_initial, maximum=internals.backoff_maximum
        )
        self._kafka_backoff = Backoff(
            initial=internals.backoff_initial, maximum=internals.backoff_maximum
        )
        self._session = LaneSession(
            self._dsn,
            lanes=settings.outbox_lanes,
            store=self._store,
            application_name=f"{client_id}@{socket.gethostname()}",
            limits=settings.database_session(),
            on_change=self.metrics.set_lanes,
            on_foreign=self.metrics.foreign_lock_holders.set,
            probe=self._probe,
        )
        delivery_timeout = settings.relay_delivery_timeout.total_seconds()
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(__name__)
        self._publisher = Publisher(
            bootstrap=settings.kafka_bootstrap,
            client_id=client_id,
            message_max_bytes=settings.relay_message_max_bytes,
            compression=internals.compression,
            extra=dict(settings.kafka_security()),
            delivery_timeout=delivery_timeout,
            tracer=self._tracer,
            partitions=internals.partitions,
            on_partitions=self.metrics.set_topic_partitions,
        )
        self.window = InflightWindow(
            max_records=settings.relay_window_records, max_bytes=settings.relay_window_bytes
        )
        self._frontier = OutboxFrontier(self._store)
        """How far each slot may be read, and where a slot without a cursor reads from (taken
        over, or nothing in flight): the floor."""
        self._stale_after = delivery_timeout + FLUSH_MARGIN
        self._cursors: dict[int, int] = {}
        """The last id read in each held slot (a slot without one reads from the floor)."""
        self._next_read = 0.0
        """monotonic() before which a round does not read (a caught-up read's cooldown)."""
        self._caught_up = True
        """Whether the last read found the lanes caught up (fewer rows than it asked for)."""
        self._to_delete: list[int] = []
        """Acknowledged ids not deleted yet: kept across a lost connection (deleting an
        acknowledged row is right whoever holds its lane), deleted before any read from a
        lane's head, so no relay reads and sends one of them again."""
        self._settled_topics: set[str] = set()
        self._settled_traces: set[ProducedTrace] = set()
        """The sends (and the writers' traces) of the rows in `_to_delete`."""
        self._tally = RoundResult()
        self._next_look = 0.0
        self._refreshed_at: float | None = None
        self.last_round: RoundResult | None = None
        """What the last round did (published, quarantined, the Kafka error that stopped it)."""
        self.pause: Pause | None = None
        """The refusal of the cluster this instance waits out now (None: not paused)."""

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

    # -- the loop ----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Publish until `stop` is set, then settle what is in flight and give back the lanes.

        Never raises for PostgreSQL or Kafka outages: it backs off (1 s -> 60 s), reports
        degraded readiness and catches up when they return.
        """
        self._stop = stop
        log_event(_log, "relay started", batchSize=self.settings.relay_batch_size)
        try:
            while not stop.is_set():
                self._beat()
                try:
                    delay = self._guarded(self._round)
                except Exception as exc:
                    delay = self._db_backoff.next_delay()
                    self.state.degraded(
                        report_failed_round(self.metrics, exc, delay, dsn=self._dsn)
                    )
                if delay > 0:
                    self._sleep(delay)
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
            conn = self._start(force=True)
            if self.active:
                self._fill(conn, self._session.readable_lanes())
                if self._settle_all(conn).stopped:
                    self._fail(conn)
                self._delete_settled(conn)
                self._release_idle(conn)
            self._finish(conn)
            return 0.0

        self._guarded(once)
        return self.last_round.published if self.last_round else 0

    def _round(self) -> float:
        """One round (the module docstring's steps), then the wait it calls for (0: none)."""
        conn = self._start(force=False)
        if not self.active:
            self._finish(conn)
            return self._lock_retry_interval
        read = self._fill(conn, self._session.readable_lanes()) if self._may_read() else 0
        full = self.window.room() == 0
        self._publisher.serve(BUSY_WAIT if (full or read == 0) and len(self.window) else 0.0)
        # Deleted in batches while the lanes have more; at once when a read found them
        # caught up (the backlog gauges and a waiting hand-over want them gone).
        settlement = self._settle(conn, flush=self._caught_up)
        if settlement.stop_failure is not None or (
            len(self.window) and self.window.oldest_age(time.monotonic()) > self._stale_after
        ):
            self._fail(conn)
        self._release_idle(conn)
        result = self._finish(conn)
        self._db_backoff.reset()
        if result.error is not None:
            return self._kafka_backoff.next_delay()
        if read and self.pause is None:
            # Paused, a read is only the next try: the delay grows until Kafka takes a row.
            self._kafka_backoff.reset()
        elif not len(self.window) and self._caught_up:
            held = slots_of(self._session.readable_lanes(), self.settings.outbox_lanes)
            wait = FRONTIER_RECHECK if self._frontier.waiting(held) else self._poll_interval
            self._session.wait_for_notify(
                min(wait, self._poll_interval), stop=self._stop, on_tick=self._beat
            )
            # Woken while the lanes cool down after a caught-up read: the next read waits
            # for the end of it, and answers every commit until then.
            return self._cooldown_left()
        return 0.0

    def _guarded(self, step: Callable[[], float]) -> float:
        """Any database error: drop the connection (and the lanes), forget the window, and
        the gauges read from the database are unknown (NaN) until a round reaches it."""
        try:
            return step()
        except Exception:
            self._session.drop()
            self._forget()
            self._refreshed_at = None
            self.metrics.set_unknown()
            raise

    # -- 1. start ----------------------------------------------------------------------------

    def _start(self, *, force: bool) -> Conn:
        """The connection; every `lock_retry_interval` (or if forced) also the lanes."""
        conn = self._session.connection()
        now = time.monotonic()
        if force or now >= self._next_look:
            self._next_look = now + self._lock_retry_interval
            self._session.rebalance()
        return conn

    # -- 2. read and produce -----------------------------------------------------------------

    def _may_read(self) -> bool:
        return time.monotonic() >= self._next_read

    def _cooldown_left(self) -> float:
        """Seconds until a round reads again after a caught-up read (0: at once)."""
        return max(0.0, self._next_read - time.monotonic())

    def _fill(self, conn: Conn, lanes: Collection[int]) -> int:
        """Read and produce the next rows of `lanes` if the window has room; rows read.

        Each slot reads on after its own cursor (the last id read in it) up to its frontier,
        which the frontier's step just before moved (a new statement, whose snapshot sees
        every row up to it): a slot taken over while others are in flight starts from the
        floor, so its oldest rows go first, and no row commits behind a cursor.
        """
        room = min(self.settings.relay_batch_size, self.window.room())
        if not lanes or room <= 0:
            self._caught_up = not lanes  # a full window: more is likely waiting
            return 0
        if not len(self.window) and self._delete_settled(conn):
            # Nothing in flight: every slot from its head again (the rows whose quarantine
            # failed, those left by a stopped flow), once the acknowledged rows there are
            # gone (while they cannot be deleted, the slots read on after their cursors).
            self._cursors.clear()
        self._frontier.step(conn)
        start = self._frontier.after
        slots = tuple(slots_of(lanes, self.settings.outbox_lanes))
        self._cursors = {slot: self._cursors.get(slot, start) for slot in slots}
        afters = tuple(self._cursors.values())
        uptos = tuple(map(self._frontier.upto, slots))
        if all(map(int.__ge__, afters, uptos)):
            self._caught_up = True  # nothing settled past any cursor: no statement
            return 0
        budget = max(1, self.window.max_bytes - self.window.bytes)
        records = self._store.read(conn, ReadRequest(slots, afters, uptos, room, budget))
        # Fewer rows than asked, and not for the budget: the slots hold no more now.
        caught_up = len(records) < room and 2 * sum(map(len, map(_VALUE, records))) < budget
        # At most one record per key in flight (InflightWindow.admissible): the rest of
        # the read waits, and is read again, from after the last one produced in its slot.
        admitted = self.window.admissible(records)
        # Caught up only if nothing read waits either: rows held behind a key in flight are
        # read again as soon as it settles, not after a NOTIFY or the poll interval.
        caught_up &= admitted == len(records)
        if caught_up:
            # Every row of each slot up to its frontier was read: a later read starts there.
            self._cursors.update(zip(slots, map(max, afters, uptos), strict=True))
        records = records[:admitted]
        # In id order, so each slot keeps the last id produced in it.
        self._cursors.update(zip(map(_SLOT, records), map(_ID, records), strict=True))
        self._caught_up = caught_up
        if records:
            self._produce(records)
        if caught_up and records and self._read_cooldown and not self._frontier.waiting(slots):
            # Rows came, and no more are there: more are likely on their way, and read
            # together after the cooldown. An empty read sets none: after a quiet spell
            # the next commit is read at once; nor does a read stopped at a frontier that
            # waits for writers (a fan-out's pages): their rows are committed or nearly,
            # and the next look reads them.
            self._next_read = time.monotonic() + self._read_cooldown
        return len(records)

    def _produce(self, records: Sequence[OutboxRecord]) -> None:
        self._tally.read += len(records)
        self._tally.first_id = self._tally.first_id or records[0].id
        if self._probe is not None:
            for slot in sorted({r.slot for r in records}):
                self._probe("produced", slot)
        self._publisher.produce(records, self.window)

    # -- 4. settle, delete, quarantine, or stop ----------------------------------------------

    def _settle(self, conn: Conn, *, flush: bool) -> Settlement:
        """Take the window's settled prefix: quarantine the refused rows, and delete the
        acknowledged ones once a batch is there (or `flush`, or nothing is in flight)."""
        settlement = self.window.settle()
        if settlement.quarantine:
            self._quarantine(conn, settlement.quarantine)
        topics, slots = self.window.take_settled()
        self._settled_topics.update(topics)
        self._settled_traces |= self.window.take_settled_traces()
        if settlement.delete:  # the cluster took these: a refusal of it, an outage, is over
            self._publisher.refusal = None
            self._publisher.unreachable_since = None
            self._tally.acknowledged |= topics - {r.record.topic for r in settlement.quarantine}
        self._to_delete.extend(settlement.delete)
        if self._to_delete and (
            flush or len(self._to_delete) >= self.settings.relay_batch_size or not len(self.window)
        ):
            self._delete_settled(conn)
        if self._probe is not None:
            for slot in sorted(slots):
                self._probe("settled", slot)
        self.metrics.in_flight.set(len(self.window))
        return settlement

    def _quarantine(self, conn: Conn, refusals: Sequence[Refusal]) -> None:
        """Move the rows refused for good into the quarantine.

        A move that meets a row another session locks (past the session's lock timeout), or
        is cut by the statement timeout, leaves the rows in the outbox and the flow goes on,
        as a DELETE that meets one does: a neighbour's long transaction must not stop the
        lanes. The rows are refused again when the lanes are next read from their heads,
        and moved then. Any other error is the round's."""
        try:
            moved = self._store.move_to_quarantine(conn, refusals)
        except (errors.LockNotAvailable, errors.QueryCanceled) as exc:
            log_event(
                _log,
                "outbox quarantine failed",
                logging.WARNING,
                error=str(exc),
                rows=len(refusals),
                outboxIds=[r.record.id for r in refusals],
            )
            return
        report_refusals(self.metrics, self._tables, refusals, moved)
        self._tally.quarantined += len(moved)

    def _settle_all(self, conn: Conn) -> Settlement:
        """Wait (bounded) for the outcome of every record in flight, then apply them."""
        self._publisher.wait(self.window, on_tick=self._beat, give_up=self._give_up)
        return self._settle(conn, flush=True)

    def _delete_settled(self, conn: Conn) -> bool:
        """Delete the acknowledged rows (exactly their ids, never a range: a writer that took
        a lower id may commit after a read of higher ones); whether none is left.

        A DELETE that meets a row another session locks (past the session's lock timeout),
        or is cut by the statement timeout, leaves the ids for the next try and the flow
        goes on: the rows are published, and a neighbour's long transaction must not stop
        the lanes (the connection survives such an error: each statement is its own
        transaction). Any other error is the round's."""
        ids = self._to_delete
        if not ids:
            return True
        sends = sorted(self._settled_traces, key=lambda t: t.send.span_id)
        # The delete's span, linked to the sends of its rows: its lines (`outbox published`
        # above all) carry its trace, and `traceIds` the writers' (docs: pin-runtime README
        # "Logging").
        with self._tracer.start_as_current_span(
            DELETE_SPAN,
            kind=trace.SpanKind.CLIENT,
            links=[trace.Link(t.send) for t in sends[:MAX_SPAN_LINKS] if t.send.is_valid],
            attributes={
                "db.system.name": "postgresql",
                "db.collection.name": self._tables.qualified,
                "db.operation.name": "DELETE",
                "db.operation.batch.size": len(ids),
            },
        ):
            try:
                deleted = self._store.delete(conn, ids)
            except (errors.LockNotAvailable, errors.QueryCanceled) as exc:
                log_event(
                    _log, "outbox delete failed", logging.WARNING, error=str(exc), rows=len(ids)
                )
                return False
            self._to_delete = []
            if deleted != len(ids):
                log_event(
                    _log,
                    "outbox rows already gone",
                    logging.WARNING,
                    expected=len(ids),
                    deleted=deleted,
                )
            topics, self._settled_topics = sorted(self._settled_topics), set()
            self._settled_traces = set()
            writers = dict.fromkeys(w for t in sends for w in t.writers)
            report_published(self.metrics, ids, topics, list(writers)[:MAX_SPAN_LINKS])
        self._tally.published += len(ids)
        self._tally.last_published_id = max(self._tally.last_published_id or 0, *ids)
        return True

    def _fail(self, conn: Conn) -> None:
        """The failure path: outcomes of all outstanding records, settle, purge the rest."""
        settlement = self._settle_all(conn)
        if not settlement.stopped:
            return  # the late outcomes were all good after all
        self._publisher.purge()
        self._tally.failed += settlement.waiting
        self._tally.error = settlement.stop_reason()
        refusal = refusal_of(settlement.stop_failure, self._publisher.refusal)
        if refusal is not None and settlement.stopped_at is not None:
            stopped = settlement.stopped_at
            self._tally.refused = Pause(refusal, stopped.topic, stopped.id, time.monotonic())
        report_stopped(
            self.metrics,
            settlement,
            published=self._tally.published,
            quarantined=self._tally.quarantined,
            refused=self._tally.refused is not None,
        )
        self.window.clear()
        self._cursors.clear()
        # The rows left go out again after the relay's backoff, not after a cooldown meant
        # for lanes that caught up: a round that skipped its read would look idle, and idle
        # lifts a pause.
        self._next_read = 0.0
        self.metrics.in_flight.set(0)

    def _release_idle(self, conn: Conn) -> None:
        """Hand over the surplus lanes with nothing in flight (their acks deleted first, so
        the next holder does not send them again)."""
        if self._session.handing_over and self._delete_settled(conn):
            self._session.release_idle(self.window.busy_slots())

    def _forget(self) -> None:
        """After the connection (and the lanes) are gone: nothing in flight is ours now."""
        self._publisher.purge()
        self.window.clear()
        self._cursors.clear()
        self.metrics.in_flight.set(0)

    # -- 5. finish ---------------------------------------------------------------------------

    def _finish(self, conn: Conn) -> RoundResult:
        """The tally taken, the floor and the gauges refreshed when due, the pause decided
        and reported on a change, readiness set from the round's outcome."""
        idle = not self._tally.read and not len(self.window)
        if idle:
            self._delete_settled(conn)  # nothing else to do: the last deletes
        result, self._tally = self._tally, RoundResult()
        # The floor the next reads from a slot's head and the gauges start at (a step every
        # STEP_INTERVAL at most when no read stepped it: outbox.frontier).
        floor = self._frontier.refresh(conn)
        # How long a writer has held a slot of this instance back, from the steps the
        # frontier took anyway: no statement of its own.
        held = slots_of(self._session.lanes, self.settings.outbox_lanes)
        self.metrics.writer_oldest_age_seconds.set(self._frontier.oldest_writer_age(held))
        # Every instance counts the whole outbox (any one of them shows it, and a stuck one
        # cannot hide the others' backlog), once per GAUGES_INTERVAL times the instances
        # running, so the fleet's counting does not grow with it; and at once after a
        # quarantine, and at the first round.
        now = time.monotonic()
        interval = GAUGES_INTERVAL * self._session.instances
        if self._refreshed_at is None or result.quarantined or now - self._refreshed_at >= interval:
            self._refreshed_at = now
            self._refresh_gauges(conn, floor)
        result.active = bool(self._session.lanes)
        # Only a read that found nothing shows that nothing waits: a round inside a read's
        # cooldown did not look.
        looked_idle = idle and not self._cooldown_left()
        before, self.pause = (
            self.pause,
            next_pause(
                self.pause, result.refused, acknowledged=result.acknowledged, idle=looked_idle
            ),
        )
        report_pause(self.metrics, before, self.pause)
        if self.pause is not before:
            pause = self.pause
            self._session.mark_pause(
                None if pause is None else pause.failure.reason,
                None if pause is None else pause.topic,
            )
        if self.pause is not None:
            self.state.degraded(f"kafka: {self.pause.describe()}")
        elif self._publisher.unreachable_since is not None:
            # Rows wait in librdkafka's queue without an error until the delivery timeout.
            down = time.monotonic() - self._publisher.unreachable_since
            self.state.degraded(f"kafka: every broker unreachable for {down:.0f} s")
        elif result.error is None:
            self.state.ok()
        else:
            self.state.degraded(f"kafka: {result.error}")
        self.last_round = result
        return result

    def _refresh_gauges(self, conn: Conn, floor: int) -> None:
        """Backlog, head age and quarantine gauges, counted from `floor` (no row lies below
        it). Every instance reports the whole outbox, whatever lanes it holds."""
        backlog = self._store.backlog(conn, floor)
        self.metrics.backlog.set(backlog.rows)
        self.metrics.oldest_age_seconds.set(backlog.oldest_age_seconds)
        self.metrics.set_quarantine_rows(self._store.quarantine_counts(conn))

    # -- waits and stop ----------------------------------------------------------------------

    def _beat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.beat()

    def _sleep(self, seconds: float) -> None:
        """Until `seconds` passed or a stop request; the heartbeat beats meanwhile."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self._stop.wait(min(remaining, WAKE_SLICE)):
                return
            self._beat()

    def _give_up(self) -> bool:
        """During a stop, in-flight deliveries get SHUTDOWN_GRACE more, then waits end."""
        if not self._stop.is_set():
            return False
        now = time.monotonic()
        self._stop_seen_at = self._stop_seen_at or now
        return now >= self._stop_seen_at + SHUTDOWN_GRACE

    def close(self) -> None:
        """Settle what is in flight (SHUTDOWN_GRACE) while the lanes are held, delete what
        was acknowledged, give back the lanes and close the producer."""
        try:
            if self._session.lanes:
                conn = self._session.connection()
                if len(self.window):
                    deadline = time.monotonic() + SHUTDOWN_GRACE
                    self._publisher.wait(self.window, give_up=lambda: time.monotonic() > deadline)
                    left = self._settle(conn, flush=True).waiting
                    if left:
                        log_event(
                            _log, "relay stop left rows in flight", logging.WARNING, rows=left
                        )
                self._delete_settled(conn)
        except Exception as exc:  # the rows stay in the outbox: sent again later
            log_event(_log, "relay stop left rows in flight", logging.WARNING, error=str(exc))
        self._publisher.close(SHUTDOWN_GRACE)
        self._forget()
        self._session.close()


class LaneSession:
    """The relay's database session: one autocommit connection that holds the member lock
    and its lanes' slot locks, and LISTENs to the writers' channel (`OutboxStore`).

    The slot locks live on the connection that also reads, deletes and quarantines rows, so
    losing that connection loses the lanes (and the other instances take them over) instead
    of two relays publishing one lane. Every wait of the session is bounded by the service's
    `SessionLimits` (statement and lock timeouts, idle-in-transaction timeout, TCP keepalives
    on both ends: the server notices a vanished relay and frees its locks within about
    idle + interval * count seconds).

    `connection()` (re)connects lazily; `rebalance()` moves towards this instance's share
    of the lanes; `drop()` after any error forgets the connection and with it every lock.
    `on_change(lanes)` follows the held lanes (the relay's gauges), `on_foreign(sessions)`
    the sessions of other logins holding lane locks (`rules.foreign_holders`).
    """

    def __init__(
        self,
        dsn: str,
        *,
        lanes: int,
        store: OutboxStore,
        application_name: str,
        limits: SessionLimits,
        on_change: Callable[[frozenset[int]], None] | None = None,
        on_foreign: Callable[[int], None] | None = None,
        probe: Probe | None = None,
    ) -> None:
        self._lanes = lanes
        self._store = store
        self._base_name = application_name
        self._name = session_name(application_name, None)
        # Autocommit: each statement its own transaction; LISTEN delivers at once. A
        # reconnect takes the name as it is now (a pause's mark included).
        self._conn = LazyConnection(
            lambda: connect(dsn, limits, application_name=self._name), prepare=store.join_relays
        )
        self._on_change = on_change or (lambda _lanes: None)
        self._on_foreign = on_foreign or (lambda _count: None)
        self._foreign_seen: set[tuple[int, str | None, str | None]] = set()
        self._probe = probe or (lambda _event, _lane: None)
        self._held: set[int] = set()
        self.instances = 1
        """Relay instances running, as the last look counted them (this one included)."""
        self._releasing: set[int] = set()
        self._standby_logged = False

    @property
    def lanes(self) -> frozenset[int]:
        """Lanes whose locks this session holds (including those being handed over)."""
        return frozenset(self._held)

    def readable_lanes(self) -> frozenset[int]:
        """Lanes to read new rows from: the held lanes not being handed over."""
        return frozenset(self._held - self._releasing)

    @property
    def handing_over(self) -> bool:
        """True while some held lane waits for its in-flight records before it goes back."""
        return bool(self._releasing)

    def connection(self) -> Conn:
        if not self._conn.is_open:
            self.drop()  # the locks of a lost session are gone with it
        return self._conn.get()

    def mark_pause(self, reason: str | None, topic: str | None = None) -> None:
        """Show the relay's pause (None: none) in this session's application_name, where
        `outbox status` reads it (`pause_mark`). Called when the pause changes, not per
        round; a session opened later is named so from its start."""
        name = session_name(self._base_name, reason, topic)
        if name == self._name:
            return
        self._name = name
        conn = self._conn.current
        if conn is not None and self._conn.is_open:
            self._store.name_session(conn, name)

    def rebalance(self) -> None:
        """One look at the instances and the locks: take free lanes up to this instance's
        share, mark the surplus for hand-over (`release_idle` gives them back)."""
        conn = self.connection()
        me = conn.info.backend_pid
        locks = self._store.lane_locks(conn)
        members = relay_instances(locks)
        self.instances = max(1, members)
        # A slot any other session holds is not free, whoever holds it: a foreign holder is
        # reported, never raced.
        others = {lk.key % self._lanes for lk in locks if not lk.member and lk.pid != me}
        self._report_foreign(foreign_holders(locks))
        plan = plan_lanes(self._lanes, members, self._held, others)
        self._releasing.update(plan.release)
        if plan.acquire:
            self._acquire(conn, plan.acquire)
        if not self._held and not self._standby_logged:
            log_event(_log, "relay standby", instances=members, lanes=self._lanes)
            self._standby_logged = True

    def _report_foreign(self, holders: list[ForeignHolder]) -> None:
        """Each foreign session once in the log (and again after it let go and came back);
        their count on every look (`on_foreign`, the relay's gauge)."""
        seen = {(h.pid, h.user_name, h.application_name) for h in holders}
        for holder in holders:
            if (holder.pid, holder.user_name, holder.application_name) in self._foreign_seen:
                continue
            log_event(
                _log,
                "relay lane locks held by a foreign session",
                logging.ERROR,
                pid=holder.pid,
                user=holder.user_name,
                application_name=holder.application_name,
                slots=list(holder.slots),
                member_lock=holder.member,
            )
        self._foreign_seen = seen
        self._on_foreign(len(holders))

    def release_idle(self, busy_slots: Collection[int]) -> None:
        """Give back the lanes marked for hand-over that have no record in flight."""
        idle = sorted(
            lane
            for lane in self._releasing
            if not any(s in busy_slots for s in slots_of([lane], self._lanes))
        )
        conn = self._conn.current
        if not idle or conn is None:
            return
        for lane in idle:
            self._probe("releasing", lane)
        self._store.unlock_slots(conn, slots_of(idle, self._lanes))
        self._held.difference_update(idle)
        self._releasing.difference_update(idle)
        log_event(_log, "relay lanes released", lanes=idle, held=sorted(self._held))
        self._on_change(self.lanes)

    def _acquire(self, conn: Conn, wanted: Collection[int]) -> None:
        slots = slots_of(wanted, self._lanes)
        got = self._store.try_lock_slots(conn, slots)
        taken = [lane for lane in wanted if all(s in got for s in slots_of([lane], self._lanes))]
        # A lane taken only in part (another instance counts lanes differently, during a
        # change of the setting) is given back whole: a slot has one publisher or none.
        partial = sorted(got - set(slots_of(taken, self._lanes)))
        if partial:
            self._store.unlock_slots(conn, partial)
        if not taken:
            return
        self._held.update(taken)
        self._standby_logged = False
        for lane in taken:
            self._probe("acquired", lane)
        log_event(
            _log,
            "relay lanes acquired",
            lanes=taken,
            held=sorted(self._held),
            pid=conn.info.backend_pid,
        )
        self._on_change(self.lanes)

    def wait_for_notify(
        self, timeout: float, *, stop: threading.Event, on_tick: Callable[[], None]
    ) -> None:
        """Sleep until a writer's NOTIFY, `timeout` or `stop`, whichever comes first.

        Woken, it also takes every NOTIFY already received: psycopg keeps those that came
        while the session ran statements, and one look at the lanes answers them all (taken
        one per wait, each writer's commit during a round would cost one more round of every
        relay: docs/design/identity-fanout.md "Outbox relay").
        """
        conn = self._conn.current
        if conn is None:
            return
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                woken = False
                # Run to its end (never left early): it yields every NOTIFY kept meanwhile
                # before it stops after one, then the poll below takes those on the wire.
                for _ in conn.notifies(timeout=min(remaining, WAKE_SLICE), stop_after=1):
                    woken = True
                if woken:
                    for _ in conn.notifies(timeout=0):
                        pass
                    return
            except Exception:
                self.drop()
                raise
            on_tick()

    def drop(self) -> None:
        """Forget the connection after an error (closing it frees every lock server-side)."""
        self._conn.discard()
        if self._held:
            log_event(_log, "relay lanes lost", logging.WARNING, lanes=sorted(self._held))
            for lane in sorted(self._held):
                self._probe("lost", lane)
        self._forget()

    def close(self) -> None:
        """Give every lane back and close the connection (a graceful stop)."""
        for lane in sorted(self._held):
            self._probe("releasing", lane)
        self._conn.close()  # ends the session: its advisory locks go with it
        if self._held:
            log_event(_log, "relay lanes released", lanes=sorted(self._held), held=[])
        self._forget()

    def _forget(self) -> None:
        changed = bool(self._held)
        self._held.clear()
        self._releasing.clear()
        self._standby_logged = False
        if changed:
            self._on_change(self.lanes)
