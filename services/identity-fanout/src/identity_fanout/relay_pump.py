"""One relay instance's flow through its lanes: read, produce, settle, delete, pipelined.

The pump reads the next rows of the held lanes (id order, after the last one in flight),
produces them at once and reads on while their acknowledgements are pending, as long as
the in-flight window has room. Settled prefixes of the window are deleted in batches
(`DELETE ... WHERE id = ANY`) and refusals for good quarantined. The first retriable
failure (or a record without an outcome past the delivery timeout) ends the flow: every
outstanding record gets its outcome (bounded wait), the settled prefix is applied, the rest
is purged and stays in the outbox to go out again from there after a backoff, so a later
row of a key never overtakes one that may yet be delivered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from identity_fanout import relay_queries as q
from identity_fanout.quarantine import quarantine_rows
from identity_fanout.relay_metrics import RelayMetrics
from identity_fanout.relay_publisher import FLUSH_MARGIN, Publisher
from identity_fanout.relay_records import record_from_row
from identity_fanout.relay_report import report_published, report_refusals, report_stopped
from identity_fanout.relay_settlement import Settlement
from identity_fanout.relay_window import InflightWindow
from pin_runtime.logging import log_event

__all__ = ["DELETE_BATCH", "Pump", "Tally"]

_log = logging.getLogger("identity_fanout.relay")

DELETE_BATCH: Final = 1000
"""Acknowledged rows deleted per statement while more keep coming (fewer when caught up)."""
BUSY_WAIT: Final = 0.05
"""How long to wait for reports when the window is full or nothing new was read."""


@dataclass(slots=True)
class Tally:
    """What the pump did since the last `take_tally()` (a `RoundResult`'s figures)."""

    read: int = 0
    published: int = 0
    quarantined: int = 0
    failed: int = 0
    first_id: int | None = None
    last_published_id: int | None = None
    error: str | None = None
    topics: set[str] = field(default_factory=set)


class Pump:
    """The window, the publisher and the cursor of one relay instance (not thread-safe)."""

    def __init__(
        self,
        publisher: Publisher,
        window: InflightWindow,
        metrics: RelayMetrics,
        *,
        batch_size: int,
        delivery_timeout: float,
        probe: Callable[[str, int], None] | None = None,
    ) -> None:
        """`probe(event, slot)`: "produced" before rows of `slot` are produced, "settled"
        after some were settled (tests of lane exclusivity)."""
        self._publisher = publisher
        self.window = window
        self._metrics = metrics
        self._batch_size = batch_size
        self._stale_after = delivery_timeout + FLUSH_MARGIN
        self._probe = probe
        self._cursor = 0
        self._to_delete: list[int] = []
        self._topics: set[str] = set()
        self.tally = Tally()

    def take_tally(self) -> Tally:
        tally, self.tally = self.tally, Tally()
        return tally

    def fill(self, conn: psycopg.Connection[TupleRow], slots: Sequence[int]) -> int:
        """Read and produce the next rows of `slots` if the window has room; rows read."""
        limit = min(self._batch_size, self.window.room())
        if not slots or limit <= 0:
            return 0
        if not len(self.window) and not self._to_delete:
            self._cursor = 0  # nothing in flight: from the head (rows committed late too)
        params = {"slots": list(slots), "after": self._cursor, "limit": limit}
        records = [record_from_row(r) for r in conn.execute(q.READ_LANES, params).fetchall()]
        if not records:
            return 0
        self._cursor = records[-1].id
        self.tally.read += len(records)
        self.tally.first_id = self.tally.first_id or records[0].id
        if self._probe is not None:
            for slot in sorted({r.slot for r in records}):
                self._probe("produced", slot)
        self._publisher.produce(records, self.window)
        return len(records)

    def cycle(
        self,
        conn: psycopg.Connection[TupleRow],
        slots: Sequence[int],
        *,
        on_tick: Callable[[], None],
        give_up: Callable[[], bool],
    ) -> int:
        """Read on if there is room, serve reports, apply what is settled; rows read."""
        read = self.fill(conn, slots)
        full = self.window.room() == 0
        self._publisher.serve(BUSY_WAIT if (full or read == 0) and len(self.window) else 0.0)
        caught_up = read < self._batch_size
        settlement = self._settle(conn, flush=caught_up)
        if settlement.stop_failure is not None or (
            len(self.window) and self.window.oldest_age(time.monotonic()) > self._stale_after
        ):
            self.fail(conn, on_tick, give_up)
        return read

    def drain(
        self,
        conn: psycopg.Connection[TupleRow],
        on_tick: Callable[[], None],
        give_up: Callable[[], bool],
    ) -> None:
        """Wait (bounded) for every outcome, apply them; anything unsettled fails the flow."""
        self._publisher.wait(self.window, on_tick=on_tick, give_up=give_up)
        settlement = self._settle(conn, flush=True)
        if settlement.stopped:
            self.fail(conn, on_tick, give_up)

    def fail(
        self,
        conn: psycopg.Connection[TupleRow],
        on_tick: Callable[[], None],
        give_up: Callable[[], bool],
    ) -> None:
        """The failure path: outcomes of all outstanding records, settle, purge the rest."""
        self._publisher.wait(self.window, on_tick=on_tick, give_up=give_up)
        settlement = self._settle(conn, flush=True)
        if not settlement.stopped:
            return  # the late outcomes were all good after all
        self._publisher.purge()
        self.tally.failed += settlement.waiting
        self.tally.error = settlement.stop_reason()
        report_stopped(
            self._metrics,
            settlement,
            published=self.tally.published,
            quarantined=self.tally.quarantined,
        )
        self.window.clear()
        self._cursor = 0
        self._metrics.in_flight.set(0)

    def forget(self) -> None:
        """After the connection (and the lanes) are gone: nothing in flight is ours now."""
        self._publisher.purge()
        self.window.clear()
        self._to_delete.clear()
        self._topics.clear()
        self._cursor = 0
        self._metrics.in_flight.set(0)

    def _settle(self, conn: psycopg.Connection[TupleRow], *, flush: bool) -> Settlement:
        settlement = self.window.settle()
        if settlement.quarantine:
            moved = quarantine_rows(conn, settlement.quarantine)
            report_refusals(self._metrics, settlement.quarantine, moved)
            self.tally.quarantined += len(moved)
        topics, slots = self.window.take_settled()
        self._topics.update(topics)
        self._to_delete.extend(settlement.delete)
        if self._to_delete and (
            flush or len(self._to_delete) >= DELETE_BATCH or not len(self.window)
        ):
            self._delete(conn)
        if self._probe is not None:
            for slot in sorted(slots):
                self._probe("settled", slot)
        self._metrics.in_flight.set(len(self.window))
        return settlement

    def _delete(self, conn: psycopg.Connection[TupleRow]) -> None:
        ids, self._to_delete = self._to_delete, []
        topics, self._topics = sorted(self._topics), set()
        deleted = conn.execute(q.DELETE_PUBLISHED, {"ids": ids}).rowcount
        if deleted != len(ids):
            log_event(
                _log,
                "outbox rows already gone",
                logging.WARNING,
                expected=len(ids),
                deleted=deleted,
            )
        report_published(self._metrics, ids, topics)
        self.tally.published += len(ids)
        self.tally.last_published_id = max(ids)
