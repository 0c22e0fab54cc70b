"""The horizon watch: how long the oldest holder of a service's database's xmin horizon has
held it, and who it is.

A session idle in a transaction with a snapshot, a forgotten prepared transaction or a
replication slot keeps every row deleted after its xmin: VACUUM may not remove them and an
index scan may not mark their entries dead, so a queue table read from its head (the
identity outbox) walks them again at every read, and the database burns CPU while idle.
Nothing else shows it, so each long-running process polls `oldest_holder` every
`HorizonWatch.interval` seconds on a connection of its own (never on a hot path) and exports
`pin_postgres_oldest_xmin_age_seconds{database}` (alert: PostgresHorizonHeld), the age in
transactions, and `pin_postgres_oldest_xmin_holder_info` naming the holder; a holder older
than `LOG_AFTER` is logged once (`postgres horizon held`), and `postgres horizon released`
when it lets go. Another role's snapshot is seen only by a member of `pg_read_all_stats`:
each service's runtime roles are (their db_roles).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final, NamedTuple

import psycopg
from prometheus_client import CollectorRegistry

from pin_runtime.logging import log_event
from pin_runtime.metrics import MetricSet, counter, gauge
from pin_runtime.postgres import Connection, LazyConnection
from pin_runtime.sql import load_queries

__all__ = ["DEFAULT_INTERVAL", "LOG_AFTER", "Holder", "HorizonMetrics", "HorizonWatch"]

_log = logging.getLogger(__name__)
_q = load_queries("pin_runtime", "queries/horizon.sql")

DEFAULT_INTERVAL: Final = 15.0
"""Seconds between polls: a scrape sees an age at most this stale, the alert waits minutes."""
LOG_AFTER: Final = 300.0
"""A holder older than this (s) is logged, once: the alert's threshold."""


class HorizonMetrics(MetricSet):
    """The horizon watch's metrics: the same names in every service that runs it."""

    oldest_age_seconds = gauge(
        "pin_postgres_oldest_xmin_age_seconds",
        "Seconds the oldest holder of the database's xmin horizon (a snapshot, a prepared "
        "transaction, a replication slot) has held it; 0 when none",
        labels=("database",),
    )
    oldest_age_transactions = gauge(
        "pin_postgres_oldest_xmin_age_transactions",
        "Transactions since the oldest holder's xmin (age(xmin)); 0 when none",
        labels=("database",),
    )
    holder = gauge(
        "pin_postgres_oldest_xmin_holder_info",
        "The oldest holder of the database's xmin horizon (1); "
        "kind session (holder: pid), prepared (gid) or slot (name)",
        labels=("database", "kind", "holder", "usename", "application_name", "state"),
    )
    errors = counter(
        "pin_postgres_horizon_watch_errors",
        "Polls of the horizon watch that failed "
        "(the database unreachable or the statement refused)",
    )


class Holder(NamedTuple):
    """The oldest holder of the horizon, as one poll found it."""

    database: str
    kind: str
    """session, prepared or slot."""
    holder: str
    """A session's pid, a prepared transaction's gid, a slot's name."""
    user_name: str
    application_name: str
    state: str
    xmin: str
    xid_age: int
    age_seconds: float | None
    """None for a slot: the server does not know since when it holds its xmin."""

    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.holder, self.xmin)


class HorizonWatch:
    """Polls the oldest holder every `interval` seconds in a daemon thread (`start`), or
    once (`poll`)."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        registry: CollectorRegistry,
        *,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.metrics = HorizonMetrics(registry)
        self.interval = interval
        self._conn = LazyConnection(connect)
        self._clock = clock
        self._first_seen: dict[tuple[str, str, str], float] = {}
        """When each slot xmin was first seen (a slot has no start time of its own)."""
        self._labels: tuple[str, ...] | None = None
        self._logged: tuple[str, str, str] | None = None
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(stop,), name="horizon-watch", daemon=True
        )
        self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.poll()
            except Exception:  # a bug: the watch goes on, the process is not its to stop
                self.metrics.errors.inc()
                _log.exception("horizon poll failed")
            stop.wait(self.interval)
        self._conn.discard()

    def poll(self) -> Holder | None:
        """One look: the gauges set from it; the oldest holder, None when nothing holds the
        horizon or the look failed (counted, logged at DEBUG: the database's own gauges say
        it is down)."""
        try:
            row = self._conn.get().execute(_q.oldest_holder, prepare=False).fetchone()
        except psycopg.Error as exc:
            self._conn.discard()
            self.metrics.errors.inc()
            _log.debug("horizon poll failed: %s", exc)
            return None
        if row is None:  # never: the statement always returns the database's row
            return None
        database = str(row[0])
        holder = None if row[1] is None else Holder(*row)
        self._show(database, holder)
        return holder

    def _show(self, database: str, holder: Holder | None) -> None:
        metrics = self.metrics
        if self._labels is not None:
            metrics.holder.remove(*self._labels)
            self._labels = None
        age = 0.0
        if holder is not None:
            key, now = holder.key(), self._clock()
            since = self._first_seen.get(key, now)
            self._first_seen = {key: since}  # only the current holder's
            age = max(0.0, now - since if holder.age_seconds is None else holder.age_seconds)
            self._labels = (
                database,
                holder.kind,
                holder.holder,
                holder.user_name,
                holder.application_name,
                holder.state,
            )
            metrics.holder.labels(*self._labels).set(1)
        metrics.oldest_age_seconds.labels(database).set(age)
        metrics.oldest_age_transactions.labels(database).set(
            0 if holder is None else holder.xid_age
        )
        if holder is not None and age >= LOG_AFTER:
            if self._logged != holder.key():
                self._logged = holder.key()
                log_event(
                    _log,
                    "postgres horizon held",
                    logging.WARNING,
                    database=database,
                    kind=holder.kind,
                    holder=holder.holder,
                    user=holder.user_name,
                    applicationName=holder.application_name,
                    state=holder.state,
                    ageSeconds=round(age, 1),
                    xidAge=holder.xid_age,
                )
        elif self._logged is not None:
            kind, name, _ = self._logged
            self._logged = None
            log_event(_log, "postgres horizon released", database=database, kind=kind, holder=name)
