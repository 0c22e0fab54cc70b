"""One relay instance's flow through its lanes: read, produce, settle, delete, pipelined.

The reads and the deletes run beside the flow, each on a session of its own thread
(`Reader`: the next read already under way while the rows before it are produced;
`Deleter`: the DELETE of what the broker acknowledged), so the loop waits for neither.

The pump reads the next rows of the held lanes (id order, after the last one in flight),
produces them at once and reads on while their acknowledgements are pending, as long as
the in-flight window has room. Settled prefixes of the window are deleted in batches
(`DELETE ... WHERE id = ANY`, in `Deleter`'s thread) and refusals for good quarantined.
The first retriable
failure (or a record without an outcome past the delivery timeout) ends the flow: every
outstanding record gets its outcome (bounded wait), the settled prefix is applied, the rest
is purged and stays in the outbox to go out again from there after a backoff, so a later
row of a key never overtakes one that may yet be delivered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Final, LiteralString, NamedTuple

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from identity_fanout.outbox import log as _log
from identity_fanout.outbox.floor import OutboxFloor
from identity_fanout.outbox.lanes import slots_of
from identity_fanout.outbox.metrics import RelayMetrics
from identity_fanout.outbox.pause import Pause, refusal_of
from identity_fanout.outbox.publisher import FLUSH_MARGIN, Publisher
from identity_fanout.outbox.quarantine import Quarantine
from identity_fanout.outbox.records import OutboxRecord, records_from_rows
from identity_fanout.outbox.report import report_published, report_refusals, report_stopped
from identity_fanout.outbox.settlement import Settlement
from identity_fanout.outbox.tables import OutboxTables
from identity_fanout.outbox.window import InflightWindow
from pin_runtime.logging import log_event
from pin_runtime.postgres import LazyConnection
from pin_runtime.sql import load_queries

Conn = psycopg.Connection[TupleRow]
Tick = Callable[[], None]
"""Called while waiting: the process's heartbeat."""
GiveUp = Callable[[], bool]
"""Asked while waiting: True once the process is stopping."""

__all__ = ["SHUTDOWN_GRACE", "Deleter", "Pump", "ReadRequest", "Reader", "RoundResult", "fetch"]

_q = load_queries("identity_fanout", "outbox/sql/relay.sql")
_VALUE = attrgetter("value")

SHUTDOWN_GRACE: Final = 5.0
"""On stop, how long in-flight deliveries may still take before the relay gives up on them
(they stay in the outbox and go out again later)."""


BUSY_WAIT: Final = 0.05
"""How long to wait for reports when the window is full or nothing new was read."""
READ_COOLDOWN: Final = 0.1
"""After a read that found the lanes caught up, seconds before the next one (the setting
IDENTITY_FANOUT_RELAY_READ_COOLDOWN): while writers keep committing, one read takes all
their commits of that time. Without it a relay that keeps up read once per commit of any
writer, and with 8 instances each read found about 80 rows, so the relays' CPU and their
statements per row grew with the instances (docs/design/identity-fanout.md "Relays side
by side"). River's producer waits the same way between fetches (FetchCooldown, 100 ms)."""


@dataclass(slots=True)
class RoundResult:
    """What one step did. The pump counts into one while the step runs (`Pump.tally`);
    `take_tally()` hands it out, `active` is set then, and nothing changes it afterwards.
    `error` is why the flow stopped (a retriable failure), if it did."""

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
    """The flow stopped on a refusal of the cluster (`relay_pause`): `error` says it too."""
    acknowledged: set[str] = field(default_factory=set)
    """Topics of rows the broker acknowledged in this step (what lifts a pause)."""


class Pump:
    """The window, the publisher and the cursor of one relay instance (not thread-safe)."""

    def __init__(
        self,
        publisher: Publisher,
        window: InflightWindow,
        metrics: RelayMetrics,
        deleter: Deleter,
        *,
        tables: OutboxTables,
        lanes: int,
        batch_size: int,
        delivery_timeout: float,
        read_cooldown: float = READ_COOLDOWN,
        probe: Callable[[str, int], None] | None = None,
    ) -> None:
        """`probe(event, slot)`: "produced" before rows of `slot` are produced, "settled"
        after some were settled (tests of lane exclusivity)."""
        self._publisher = publisher
        self.window = window
        self._metrics = metrics
        self._deleter = deleter
        self._flush_timeout = delivery_timeout
        self._batch_size = batch_size
        self._stale_after = delivery_timeout + FLUSH_MARGIN
        self._probe = probe
        self._lanes = lanes
        self._read_cooldown = read_cooldown
        self._next_read = 0.0
        """monotonic() before which `cycle` does not read (a caught-up read's cooldown)."""
        self._cursors: dict[int, int] = {}
        self.floor = OutboxFloor(tables)
        """Where a lane without a cursor reads from (taken over, or nothing in flight)."""
        self.quarantine = Quarantine(tables)
        self._reader = Reader(LaneRead(tables))
        self._to_delete: list[int] = []
        self._topics: set[str] = set()
        self.tally = RoundResult()

    def take_tally(self) -> RoundResult:
        """The figures since the last call (a fresh tally starts)."""
        tally, self.tally = self.tally, RoundResult()
        tally.published, tally.last_published_id = self._deleter.take_published()
        return tally

    def fill(self, conn: Conn, lanes: Collection[int]) -> int:
        """Read and produce the next rows of `lanes` if the window has room; rows read.

        Each lane reads on after its own cursor (the last id read in it): a lane taken over
        while others are in flight starts from its head, so its oldest rows go first.
        Lanes sharing a cursor are read together, normally all of them in one statement.
        """
        room = min(self._batch_size, self.window.room())
        if not lanes or room <= 0:
            return 0
        if not len(self.window) and not self._to_delete and not self._deleter.pending:
            self._cursors.clear()  # nothing in flight: from the heads (late commits too)
        # A lane's head is read from the floor, below which no row is nor will be (late
        # commits included): not from the first index entry, past every deleted row that a
        # held snapshot keeps alive (outbox.floor).
        start = self.floor.after
        self._cursors = {lane: self._cursors.get(lane, start) for lane in lanes}
        groups: dict[int, list[int]] = {}
        for lane, after in self._cursors.items():
            groups.setdefault(after, []).append(lane)
        read = read_bytes = 0
        caught_up = True
        for after, group in sorted(groups.items()):
            limit = room - read
            if limit <= 0:
                caught_up = False
                break
            slots = tuple(slots_of(group, self._lanes))
            budget = max(1, self.window.max_bytes - self.window.bytes - read_bytes)
            records = self._reader.read(conn, ReadRequest(slots, after, limit, budget))
            # Fewer rows than asked, and not for the budget: the lanes hold no more now.
            caught_up &= len(records) < limit and 2 * sum(map(len, map(_VALUE, records))) < budget
            # At most one record per key in flight (InflightWindow.admissible): the rest of
            # the read waits, and is read again, from after the last one produced.
            records = records[: self.window.admissible(records)]
            if not records:
                continue
            read_bytes += sum(map(len, map(_VALUE, records)))
            for lane in group:  # every row of the group up to here is read
                self._cursors[lane] = records[-1].id
            read += len(records)
            if len(groups) == 1 and len(records) == limit:  # more is likely: read ahead
                budget = max(1, self.window.max_bytes - self.window.bytes - read_bytes)
                following = ReadRequest(slots, records[-1].id, self._batch_size, budget)
                self._reader.ahead(conn, following)
            self._produce(records)
        if caught_up and read and self._read_cooldown:
            # Rows came, and no more are there: more are likely on their way, and read
            # together after the cooldown. An empty read sets none: after a quiet spell
            # the next commit is read at once.
            self._next_read = time.monotonic() + self._read_cooldown
        return read

    def cooldown_left(self) -> float:
        """Seconds until `cycle` reads again after a caught-up read (0: at once)."""
        return max(0.0, self._next_read - time.monotonic())

    def _produce(self, records: Sequence[OutboxRecord]) -> None:
        self.tally.read += len(records)
        self.tally.first_id = self.tally.first_id or records[0].id
        if self._probe is not None:
            for slot in sorted({r.slot for r in records}):
                self._probe("produced", slot)
        self._publisher.produce(records, self.window)

    def flush(self) -> bool:
        """Wait (bounded) until every acknowledged row is deleted: before lanes are handed
        over, and at the end of `run_once`. False if the database did not let it."""
        if self._to_delete:
            self._submit()
        return self._deleter.flush(self._flush_timeout)

    def cycle(self, conn: Conn, lanes: Collection[int], *, on_tick: Tick, give_up: GiveUp) -> int:
        """Read on if there is room (and the last read's cooldown is over), serve reports,
        apply what is settled; rows read."""
        read = self.fill(conn, lanes) if time.monotonic() >= self._next_read else 0
        full = self.window.room() == 0
        self._publisher.serve(BUSY_WAIT if (full or read == 0) and len(self.window) else 0.0)
        caught_up = read < self._batch_size
        settlement = self._settle(conn, flush=caught_up)
        if settlement.stop_failure is not None or (
            len(self.window) and self.window.oldest_age(time.monotonic()) > self._stale_after
        ):
            self.fail(conn, on_tick, give_up)
        return read

    def drain(self, conn: Conn, on_tick: Tick, give_up: GiveUp) -> None:
        """Wait (bounded) for every outcome, apply them; anything unsettled fails the flow."""
        if self._settle_all(conn, on_tick, give_up).stopped:
            self.fail(conn, on_tick, give_up)

    def fail(self, conn: Conn, on_tick: Tick, give_up: GiveUp) -> None:
        """The failure path: outcomes of all outstanding records, settle, purge the rest."""
        settlement = self._settle_all(conn, on_tick, give_up)
        if not settlement.stopped:
            return  # the late outcomes were all good after all
        self._publisher.purge()
        self.tally.failed += settlement.waiting
        self.tally.error = settlement.stop_reason()
        refusal = refusal_of(settlement.stop_failure, self._publisher.refusal)
        if refusal is not None and settlement.stopped_at is not None:
            stopped = settlement.stopped_at
            self.tally.refused = Pause(refusal, stopped.topic, stopped.id, time.monotonic())
        report_stopped(
            self._metrics,
            settlement,
            published=self.tally.published,
            quarantined=self.tally.quarantined,
            refused=self.tally.refused is not None,
        )
        self.window.clear()
        self._cursors.clear()
        # The rows left go out again after the relay's backoff, not after a cooldown meant
        # for lanes that caught up: a step that skipped its read would look idle, and idle
        # lifts a pause (a paused relay said "resumed" and "paused" again within 0.1 s).
        self._next_read = 0.0
        self._metrics.in_flight.set(0)

    def stop(self, connection: Callable[[], Conn] | None) -> None:
        """On stop: in-flight records get SHUTDOWN_GRACE (settled on `connection()` if the
        lanes are still held), acknowledged rows are deleted, then every client closes."""
        if len(self.window) and connection is not None:
            deadline = time.monotonic() + SHUTDOWN_GRACE
            try:
                self.drain(connection(), lambda: None, lambda: time.monotonic() > deadline)
            except Exception as exc:  # the rows stay in the outbox: sent again later
                log_event(_log, "relay stop left rows in flight", logging.WARNING, error=str(exc))
        self._publisher.close(SHUTDOWN_GRACE)
        self.forget()
        self._reader.close()
        self._deleter.close(SHUTDOWN_GRACE)  # acknowledged rows go before the lanes do

    def forget(self) -> None:
        """After the connection (and the lanes) are gone: nothing in flight is ours now."""
        self._reader.forget()
        self._publisher.purge()
        self.window.clear()
        self._to_delete.clear()
        self._topics.clear()
        self._cursors.clear()
        self._metrics.in_flight.set(0)

    def _settle_all(self, conn: Conn, on_tick: Tick, give_up: GiveUp) -> Settlement:
        """Wait (bounded) for the outcome of every record in flight, then apply them."""
        self._publisher.wait(self.window, on_tick=on_tick, give_up=give_up)
        return self._settle(conn, flush=True)

    def _settle(self, conn: Conn, *, flush: bool) -> Settlement:
        settlement = self.window.settle()
        if settlement.quarantine:
            moved = self.quarantine.move(conn, settlement.quarantine)
            report_refusals(self._metrics, self.quarantine.tables, settlement.quarantine, moved)
            self.tally.quarantined += len(moved)
        topics, slots = self.window.take_settled()
        self._topics.update(topics)
        if settlement.delete:  # the cluster took these: a refusal of it is over
            self._publisher.refusal = None
            self.tally.acknowledged |= topics - {r.record.topic for r in settlement.quarantine}
        self._to_delete.extend(settlement.delete)
        if self._to_delete and (
            flush or len(self._to_delete) >= self._batch_size or not len(self.window)
        ):
            self._submit()
        if self._probe is not None:
            for slot in sorted(slots):
                self._probe("settled", slot)
        self._metrics.in_flight.set(len(self.window))
        return settlement

    def _submit(self) -> None:
        ids, self._to_delete = self._to_delete, []
        topics, self._topics = sorted(self._topics), set()
        self._deleter.submit(ids, topics)


# -- reading ahead -------------------------------------------------------------------------

# Reading a lane group's next rows, with the following read already under way.
#
# The next read runs on the lanes' own connection (psycopg serializes its use) in a thread of
# its own while the rows before it are produced: the database's latency and the producing
# overlap, and a lost connection still shows at the next read (its error surfaces there).


class ReadRequest(NamedTuple):
    """Up to `limit` rows of `slots` after `after`, within `budget` payload bytes."""

    slots: tuple[int, ...]
    after: int
    limit: int
    budget: int

    def same_rows(self, other: ReadRequest) -> bool:
        """Whether `other` reads from the same place (its limit and budget may differ)."""
        return (self.slots, self.after) == (other.slots, other.after)


MERGED_UP_TO: Final = 16
"""A relay holding at most this many slots reads each slot's head and merges them
(`read_slot_heads`); with more it walks the primary key (`read_lanes`). Backend CPU per read
of 5,000 of 200,000 rows, walk against merge: 64 slots 21.5 / 38.0 ms, 32: 27.0 / 35.5,
16: 33.0 / 29.5, 8: 53.0 / 26.5 (docs/design/identity-fanout.md "Relays side by side")."""


_MERGED_KEPT: Final = 256
"""Merged statements kept at most: one per set of slots read together (a relay's lanes, or
those sharing a cursor), which a rebalance or a takeover changes."""


class LaneRead:
    """The statement that reads a set of slots: the walk of the primary key, or for few
    slots the merge of their heads (composed once per set of slots)."""

    def __init__(self, tables: OutboxTables) -> None:
        self._walk = tables.compose(_q, "read_lanes")
        self._tables = tables
        self._merged: dict[tuple[int, ...], LiteralString] = {}

    def statement(self, slots: tuple[int, ...]) -> LiteralString:
        if len(slots) > MERGED_UP_TO:
            return self._walk
        merged = self._merged.get(slots)
        if merged is None:
            if len(self._merged) >= _MERGED_KEPT:  # lanes regrouped often: keep it bounded
                self._merged.clear()
            heads = sql.SQL(" UNION ALL ").join(
                sql.SQL(self._tables.compose(_q, "slot_head", slot=sql.Literal(slot)))
                for slot in slots
            )
            merged = self._merged[slots] = self._tables.compose(_q, "read_slot_heads", heads=heads)
        return merged


class Reader:
    """`read(...)` the rows after a cursor; `ahead(...)` starts the following read."""

    def __init__(self, statement: LaneRead) -> None:
        self._statement = statement
        self._executor: ThreadPoolExecutor | None = None
        self._ahead: tuple[ReadRequest, Future[list[OutboxRecord]]] | None = None

    def read(self, conn: psycopg.Connection[TupleRow], request: ReadRequest) -> list[OutboxRecord]:
        """The rows `request` asks for: those read ahead if they are what is asked (same
        slots, same cursor), else read now."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            asked, future = ahead
            records = future.result()
            if asked.same_rows(request) and records:
                return records[: request.limit]
        return fetch(conn, self._statement.statement(request.slots), request)

    def ahead(self, conn: psycopg.Connection[TupleRow], request: ReadRequest) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="outbox-reader")
        statement = self._statement.statement(request.slots)
        self._ahead = (request, self._executor.submit(fetch, conn, statement, request))

    def forget(self) -> None:
        """Drop what was read ahead (a reset cursor, lost lanes)."""
        self._ahead = None

    def close(self) -> None:
        self._ahead = None
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


def fetch(
    conn: psycopg.Connection[TupleRow], statement: LiteralString, request: ReadRequest
) -> list[OutboxRecord]:
    """`request`'s rows by `statement` (`read_lanes` of the service's outbox)."""
    params = request._asdict() | {"slots": list(request.slots)}
    # Binary: the payload (bytea) arrives as is instead of hex text to decode.
    # Never prepared, so PostgreSQL plans every read for its own parameters and the outbox
    # as it is now. Prepared (psycopg does it after `prepare_threshold` runs), the read is
    # soon served by a generic plan, and an idle relay makes that plan while the outbox is
    # empty: a sequential scan and a sort of the whole outbox, kept for the next burst
    # (every read of 5,000 rows of 200,000 then sorted all of them). Planning costs ~0.3 ms
    # per read of up to RELAY_BATCH_SIZE rows. The same holds for every statement run often
    # on the outbox, a table that is empty one moment and holds millions of rows the next:
    # the deletes, the backlog count, the writers' depth (docs/design/identity-fanout.md
    # "Outbox relay", "Plans on the outbox").
    rows = conn.execute(statement, params, binary=True, prepare=False).fetchall()
    return records_from_rows(rows)


# -- deleting beside the flow --------------------------------------------------------------

# Deleting acknowledged outbox rows beside the relay's flow, on a connection of its own.
#
# The relay's loop reads, produces and settles; the DELETE of what the broker acknowledged
# runs in this thread meanwhile, so the loop never waits for it. Deleting an acknowledged row
# is right whoever holds its lane, so this connection needs no lock. Until its DELETE is done
# a row still counts as pending (`pending`): the loop does not read its lanes from the head
# again nor hand them over before `flush()`, which keeps a row from being sent twice by
# this relay or by the next holder. A failed DELETE is retried (the rows are only sent again
# if the relay stops first: at-least-once).

RETRY_PAUSE: Final = 0.5


class Deleter:
    """A thread deleting submitted batches of acknowledged ids, in submission order."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[TupleRow]],
        metrics: RelayMetrics,
        tables: OutboxTables,
    ) -> None:
        self._metrics = metrics
        self._statement = tables.compose(_q, "delete_published")
        self._queue: deque[tuple[list[int], list[str]]] = deque()
        self._pending = 0
        self._done = threading.Condition()
        self._closing = False
        self._conn = LazyConnection(connect)
        self._thread: threading.Thread | None = None
        self.published = 0
        self.last_id: int | None = None
        self.error: str | None = None

    @property
    def pending(self) -> int:
        """Acknowledged rows submitted and not deleted yet."""
        return self._pending

    def submit(self, ids: list[int], topics: Sequence[str]) -> None:
        with self._done:
            self._queue.append((ids, list(topics)))
            self._pending += len(ids)
            self._done.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="outbox-deleter", daemon=True)
            self._thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait until everything submitted is deleted; False if `timeout` ran out first."""
        with self._done:
            return self._done.wait_for(lambda: self._pending == 0, timeout)

    def take_published(self) -> tuple[int, int | None]:
        """Rows deleted and the highest id since the last call."""
        with self._done:
            published, last = self.published, self.last_id
            self.published, self.last_id = 0, None
        return published, last

    def close(self, timeout: float) -> None:
        self.flush(timeout)
        with self._done:
            self._closing = True
            self._done.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._done:
            self._closing = False
        self._conn.discard()

    def _run(self) -> None:
        while True:
            with self._done:
                self._done.wait_for(lambda: bool(self._queue) or self._closing)
                if not self._queue:
                    return
                ids, topics = self._queue[0]
            try:
                deleted = self._delete(ids)
            except Exception as exc:  # an outage: keep the ids, try again
                log_event(_log, "outbox delete failed", logging.WARNING, error=str(exc))
                self.error = str(exc)
                self._conn.discard()
                with self._done:
                    if self._done.wait_for(lambda: self._closing, RETRY_PAUSE):
                        return
                continue
            if deleted != len(ids):
                log_event(
                    _log,
                    "outbox rows already gone",
                    logging.WARNING,
                    expected=len(ids),
                    deleted=deleted,
                )
            report_published(self._metrics, ids, topics)
            with self._done:
                self._queue.popleft()
                self.error = None
                self._pending -= len(ids)
                self.published += len(ids)
                self.last_id = max(self.last_id or 0, *ids)
                self._done.notify_all()

    def _delete(self, ids: list[int]) -> int:
        # An array literal built in C: psycopg would dump a list of ints element by element.
        literal = "{" + ",".join(map(str, ids)) + "}"
        # Unprepared, as every statement of the relay on the outbox (`fetch`).
        return self._conn.get().execute(self._statement, {"ids": literal}, prepare=False).rowcount
