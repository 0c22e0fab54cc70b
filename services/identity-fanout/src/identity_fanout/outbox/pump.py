"""One relay instance's flow through its lanes: read, produce, settle, delete, pipelined.

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
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from identity_fanout.outbox.deleter import Deleter
from identity_fanout.outbox.lanes import slots_of
from identity_fanout.outbox.log import log as _log
from identity_fanout.outbox.metrics import RelayMetrics
from identity_fanout.outbox.pacing import SHUTDOWN_GRACE
from identity_fanout.outbox.pause import Pause, refusal_of
from identity_fanout.outbox.publisher import FLUSH_MARGIN, Publisher
from identity_fanout.outbox.quarantine import quarantine_rows
from identity_fanout.outbox.reader import Reader, ReadRequest
from identity_fanout.outbox.records import OutboxRecord
from identity_fanout.outbox.report import report_refusals, report_stopped
from identity_fanout.outbox.settlement import Settlement
from identity_fanout.outbox.window import InflightWindow
from pin_runtime.logging import log_event

Conn = psycopg.Connection[TupleRow]
Tick = Callable[[], None]
"""Called while waiting: the process's heartbeat."""
GiveUp = Callable[[], bool]
"""Asked while waiting: True once the process is stopping."""

__all__ = ["Pump", "RoundResult"]


BUSY_WAIT: Final = 0.05
"""How long to wait for reports when the window is full or nothing new was read."""


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
        lanes: int,
        batch_size: int,
        delivery_timeout: float,
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
        self._cursors: dict[int, int] = {}
        self._reader = Reader()
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
        self._cursors = {lane: self._cursors.get(lane, 0) for lane in lanes}
        groups: dict[int, list[int]] = {}
        for lane, after in self._cursors.items():
            groups.setdefault(after, []).append(lane)
        read = read_bytes = 0
        for after, group in sorted(groups.items()):
            limit = room - read
            if limit <= 0:
                break
            slots = tuple(slots_of(group, self._lanes))
            budget = max(1, self.window.max_bytes - self.window.bytes - read_bytes)
            records = self._reader.read(conn, ReadRequest(slots, after, limit, budget))
            # At most one record per key in flight (InflightWindow.admissible): the rest of
            # the read waits, and is read again, from after the last one produced.
            records = records[: self.window.admissible(records)]
            if not records:
                continue
            read_bytes += sum(len(r.value) for r in records)
            for lane in group:  # every row of the group up to here is read
                self._cursors[lane] = records[-1].id
            read += len(records)
            if len(groups) == 1 and len(records) == limit:  # more is likely: read ahead
                budget = max(1, self.window.max_bytes - self.window.bytes - read_bytes)
                following = ReadRequest(slots, records[-1].id, self._batch_size, budget)
                self._reader.ahead(conn, following)
            self._produce(records)
        return read

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
        """Read on if there is room, serve reports, apply what is settled; rows read."""
        read = self.fill(conn, lanes)
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
            moved = quarantine_rows(conn, settlement.quarantine)
            report_refusals(self._metrics, settlement.quarantine, moved)
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
