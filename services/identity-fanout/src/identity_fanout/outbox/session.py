"""The relay's database session: one connection that holds its lanes' locks and LISTENs.

The slot locks live on the connection that also reads, deletes and quarantines rows, so
losing that connection loses the lanes (and the other instances take them over) instead of
two relays publishing one lane. Every wait of the session is bounded by the service's
`SessionLimits` (statement and lock timeouts, idle-in-transaction timeout, TCP keepalives
on both ends: the server notices a vanished relay and frees its locks within about
idle + interval * count seconds).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Final

import psycopg
from psycopg.rows import TupleRow, class_row

from identity_fanout.outbox import log as _log
from identity_fanout.outbox.lanes import (
    ForeignHolder,
    LaneLock,
    foreign_holders,
    plan_lanes,
    relay_instances,
    slots_of,
)
from identity_fanout.outbox.pause_mark import session_name
from identity_fanout.outbox.tables import OutboxTables
from pin_runtime.logging import log_event
from pin_runtime.postgres import LazyConnection, SessionLimits, connect, listen
from pin_runtime.sql import load_queries

__all__ = ["WAKE_SLICE", "LaneSession"]

_q = load_queries("identity_fanout", "outbox/sql/lanes.sql")

WAKE_SLICE: Final = 0.5
"""Longest uninterruptible wait: bounds the reaction to a stop request."""

Probe = Callable[[str, int], None]
"""`probe(event, lane)`: "acquired" after a lane's locks are taken, "releasing" before they
are given back, "lost" when the connection (and every lock) is gone. For tests."""


class LaneSession:
    """An autocommit connection, the member lock, LISTEN to the outbox's channel, and the
    held lanes (the advisory-lock classes are the outbox's: `OutboxTables`).

    `connection()` (re)connects lazily; `rebalance()` moves towards this instance's share
    of the lanes; `drop()` after any error forgets the connection and with it every lock.
    `on_change(lanes)` follows the held lanes (the relay's gauges), `on_foreign(sessions)`
    the sessions of other logins holding lane locks (`lanes.foreign_holders`).
    """

    def __init__(
        self,
        dsn: str,
        *,
        lanes: int,
        tables: OutboxTables,
        application_name: str,
        limits: SessionLimits,
        on_change: Callable[[frozenset[int]], None] | None = None,
        on_foreign: Callable[[int], None] | None = None,
        probe: Probe | None = None,
    ) -> None:
        self._lanes = lanes
        self._channel = tables.channel
        self._lane_class = tables.lane_lock_class
        self._member_class = tables.member_lock_class
        self._lane_locks = tables.compose(_q, "lane_locks")
        # Autocommit: each statement its own transaction; LISTEN delivers at once.
        self._base_name = application_name
        self._name = session_name(application_name, None)
        # A reconnect takes the name as it is now (a pause's mark included).
        self._conn = LazyConnection(
            lambda: connect(dsn, limits, application_name=self._name), prepare=self._join
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

    def connection(self) -> psycopg.Connection[TupleRow]:
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
            conn.execute(_q.set_name, {"name": name})

    def _join(self, conn: psycopg.Connection[TupleRow]) -> None:
        conn.execute(_q.join_members, {"members": self._member_class})
        # LISTEN before the first read: a row committed after the read still wakes us.
        listen(conn, self._channel)

    def rebalance(self) -> None:
        """One look at the instances and the locks: take free lanes up to this instance's
        share, mark the surplus for hand-over (`release_idle` gives them back)."""
        conn = self.connection()
        me = conn.info.backend_pid
        with conn.cursor(row_factory=class_row(LaneLock)) as cur:
            locks = cur.execute(
                self._lane_locks, {"class": self._lane_class, "members": self._member_class}
            ).fetchall()
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
        conn.execute(
            _q.unlock_slots, {"class": self._lane_class, "slots": slots_of(idle, self._lanes)}
        )
        self._held.difference_update(idle)
        self._releasing.difference_update(idle)
        log_event(_log, "relay lanes released", lanes=idle, held=sorted(self._held))
        self._on_change(self.lanes)

    def _acquire(self, conn: psycopg.Connection[TupleRow], wanted: Collection[int]) -> None:
        slots = slots_of(wanted, self._lanes)
        got = {
            s
            for s, ok in conn.execute(
                _q.try_lock_slots, {"class": self._lane_class, "slots": slots}
            ).fetchall()
            if ok
        }
        taken = [lane for lane in wanted if all(s in got for s in slots_of([lane], self._lanes))]
        # A lane taken only in part (another instance counts lanes differently, during a
        # change of the setting) is given back whole: a slot has one publisher or none.
        partial = sorted(got - set(slots_of(taken, self._lanes)))
        if partial:
            conn.execute(_q.unlock_slots, {"class": self._lane_class, "slots": partial})
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
        while the session ran statements, and one look at the lanes answers them all. Taken
        one per wait, each writer's commit during a round cost one more read and backlog
        count of every relay, so the relays' statements per row grew with the writers
        (docs/design/identity-fanout.md "Relays side by side").
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
