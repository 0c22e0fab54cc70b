"""The fan-out worker loop: wait for work, claim a unit (a shard or a whole task), walk it.

- Woken at once by NOTIFY on enqueue (and on a split), otherwise polling every
  PollingInterval.
- One unit at a time per worker, fair between tasks (`FanoutQueue.claim`): a small role
  waits for at most one shard of a large one; parallel workers take disjoint units
  (SKIP LOCKED).
- A freshly claimed task of a role above ShardSize users is split into shards at once, so
  the other workers share it (docs/design/identity-fanout.md "Sharded fan-out").
- Failure, lease loss, supersession, backpressure and graceful stop are handled per unit
  (`walk`); an outage backs the whole loop off instead.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final

import psycopg
from opentelemetry import trace
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from identity_fanout.fanout.metrics import FanoutMetrics
from identity_fanout.fanout.queue import TASKS_CHANNEL, FanoutQueue, Unit, queue_state
from identity_fanout.fanout.session_name import worker_session_name
from identity_fanout.fanout.walk import WalkEnd, Walker, WorkerSignals, classify_failure
from identity_fanout.schema import OUTBOX
from identity_fanout.settings import Settings
from pin_runtime.backoff import Backoff
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.logging import log_event
from pin_runtime.postgres import (
    LazyConnection,
    OnRefused,
    SessionLimits,
    connect,
    listen,
    report_auth_failure,
)

__all__ = ["FanoutWorker", "WorkerSignals", "refused_logins"]

_log = logging.getLogger(__name__)


OUTAGE_BACKOFF_MAX_SECONDS: Final = 60.0
"""The longest wait between two tries while the database fails every poll or batch."""


def refused_logins(dsn: str, metrics: FanoutMetrics) -> OnRefused:
    """What the worker's connects (its pool's, its LISTEN session's) do with a login
    PostgreSQL refuses: `database authentication failed`, counted, as the relay's rounds."""
    return lambda exc: report_auth_failure(exc, dsn, metrics.database_auth_failures.inc, log=_log)


class FanoutWorker:
    """One worker: the loop over the queue, on a pool of the service's sessions."""

    def __init__(
        self,
        settings: Settings,
        *,
        pool: ConnectionPool[psycopg.Connection[TupleRow]],
        metrics: FanoutMetrics,
        stop: threading.Event,
        database: ComponentState | None = None,
        heartbeat: Heartbeat | None = None,
        signals: WorkerSignals | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        signals = signals or WorkerSignals()
        self._settings = settings
        self._pool = pool
        self._metrics = metrics
        self._stop = stop
        self._database = database or ComponentState(initial=None)
        self._heartbeat = heartbeat
        self.queue = FanoutQueue(
            lease=settings.max_lease_duration, max_attempts=settings.max_attempts
        )
        dsn = settings.database_dsn.reveal()
        # The LISTEN connection is a session of its own: bounded like the pool's.
        self._wakeup = _Wakeup(
            dsn=dsn,
            session=settings.database_session(),
            stop=stop,
            beat=self._beat,
            clock=signals.clock,
            on_refused=refused_logins(dsn, metrics),
            application_name=worker_session_name(),
        )
        self._tracer = tracer or trace.get_tracer("identity_fanout.fanout.worker")
        self._walker = Walker(
            pool,
            self.queue,
            settings,
            metrics,
            stop=stop,
            beat=self._beat,
            signals=signals,
            tracer=self._tracer,
        )

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        """Work until the stop event is set; then return (the current unit handed back).

        Nothing the database does stops the loop: a failed poll (unreachable, a table or a
        privilege missing) or a unit failing for a reason not its own is counted, logged,
        shown on /readyz, and retried after a backoff (1 s doubling to 60 s), so the
        errors alert pages and the worker resumes by itself once the cause is gone.
        """
        backoff = Backoff(initial=1.0, maximum=OUTAGE_BACKOFF_MAX_SECONDS)
        while not self._stop.is_set():
            self._beat()
            try:
                outcome = self.run_once()
            except Exception as exc:
                self._metrics.errors.labels(kind="poll").inc()
                self._database.degraded(f"{type(exc).__name__}: {exc}")
                delay = backoff.next_delay()
                log_event(
                    _log,
                    "poll failed",
                    logging.ERROR,
                    exception=f"{type(exc).__name__}: {exc}",
                    failure=classify_failure(exc).value,
                    retryInSeconds=round(delay, 1),
                )
                self._wakeup.close()
                self._stop.wait(delay)
                continue
            if outcome is WalkEnd.OUTAGE:
                self._database.degraded("batches fail for a reason not their own")
                self._stop.wait(self._walker.retry_after)
                continue
            backoff.reset()
            self._database.ok()
            if outcome is None:
                if not self._walker.failing:  # nothing to do: a healthy run
                    self._metrics.last_success.set(time.time())
                self._wakeup.wait(self._settings.polling_interval)
        self._wakeup.close()

    def run_once(self) -> WalkEnd | None:
        """Refresh the gauges, then claim and walk one unit.

        None when the queue had nothing to claim; otherwise how the unit's walk ended (a
        poisoned unit or a split ends as COMPLETED: the next cycle claims again at once).
        """
        self._walker.record_pending_failures()
        self.refresh_gauges()
        with self._pool.connection() as conn:
            unit = self.queue.claim(conn)
        if unit is None:
            return None
        if unit.poisoned:
            self._walker.on_poisoned(unit)
            return WalkEnd.COMPLETED
        if unit.splittable:
            split = self._split(unit)
            if split is not None:
                return split  # the next cycle claims a shard (or the task again)
        return self.walk(unit)

    def walk(self, unit: Unit) -> WalkEnd:
        """Walk a claimed unit from its Cursor to the end (or stop, fence, failure)."""
        return self._walker.walk(unit)

    def _split(self, unit: Unit) -> WalkEnd | None:
        """Split a large task into shards; None if small (walk it whole); how it failed
        otherwise (retried like a failed batch). In a span of its own, so its lines (the
        task's `task dequeued`, `task split`, a failure) carry a trace."""
        attributes: dict[str, str | int] = {"attempt": unit.attempt, **unit.ids()}
        with self._tracer.start_as_current_span("access-fanout split", attributes=attributes):
            try:
                with self._pool.connection() as conn:
                    shards = self.queue.split(conn, unit, shard_size=self._settings.shard_size)
            except Exception as exc:
                return self._walker.on_failure(unit, str(uuid.uuid4()), exc)
            if not shards:
                return None
            self._walker.committed(unit.id)
            log_event(_log, "task dequeued", attempt=unit.attempt, **unit.ids())
            log_event(_log, "task split", shards=shards, **unit.ids())
            return WalkEnd.COMPLETED

    def refresh_gauges(self) -> None:
        """The queue's gauges and the outbox's depth, read from the database: every worker
        reports them, so they survive every relay being down."""
        with self._pool.connection() as conn:
            state = queue_state(conn)
            depth = OUTBOX.depth(conn, self._walker.outbox_frontier.refresh(conn))
        self._walker.observe_outbox(depth)
        self._metrics.queue_backlog.set(state.backlog)
        self._metrics.leased_tasks.set(state.leased)
        self._metrics.failed_tasks.set(state.failed)
        self._metrics.oldest_task_age_seconds.set(state.oldest_age_seconds)
        self._metrics.oldest_waiting_seconds.set(state.oldest_waiting_seconds)

    def _beat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.beat()


# -- waiting for work -----------------------------------------------------------------------


@dataclass(eq=False, kw_only=True)
class _Wakeup:
    """A LISTEN session of its own (bounded like the pool's), reopened after a failure."""

    dsn: str
    session: SessionLimits
    stop: threading.Event
    beat: Callable[[], None]
    clock: Callable[[], float] = time.monotonic
    on_refused: OnRefused | None = None
    application_name: str | None = None
    _listener: LazyConnection = field(init=False)

    def __post_init__(self) -> None:
        self._listener = LazyConnection(
            lambda: connect(
                self.dsn,
                self.session,
                application_name=self.application_name,
                on_refused=self.on_refused,
            ),
            prepare=lambda conn: listen(conn, TASKS_CHANNEL),
        )

    def wait(self, polling_interval: timedelta) -> None:
        """Sleep until NOTIFY, the polling interval, or a stop request, whichever is first."""
        deadline = self.clock() + polling_interval.total_seconds()
        listener = self._listen()
        while not self.stop.is_set():
            remaining = deadline - self.clock()
            if remaining <= 0:
                return
            # Short slices so a stop request is seen within half a second.
            slice_seconds = min(remaining, 0.5)
            if listener is None:
                self.stop.wait(slice_seconds)
                continue
            try:
                for _ in listener.notifies(timeout=slice_seconds, stop_after=1):
                    return
            except psycopg.Error:
                self._listener.discard()
                listener = None
            self.beat()

    def _listen(self) -> psycopg.Connection[TupleRow] | None:
        try:
            return self._listener.get()
        except psycopg.Error as exc:
            log_event(_log, "listen failed; polling only", logging.WARNING, exception=repr(exc))
            self._listener.discard()
            return None

    def close(self) -> None:
        self._listener.close()
