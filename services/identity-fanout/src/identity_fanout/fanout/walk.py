"""Walking one unit of work batch by batch: a whole task, or one shard of a large task.

Both walk the same way: a failed batch is rolled back, its reason kept on the unit and its
lease shortened so it is retried soon; a lost lease drops the unit at once (the batch in
hand rolled back, nothing emitted); a newer version of the role supersedes the unit (it
stops where it is); a stop request is honoured between batches by handing the unit back.

Whose fault a failure is decides whether it brings the unit closer to poison
(`classify_failure`, `counts_against_unit`): a unit's own failure counts an attempt; an
outage (the database unreachable, the schema or a privilege missing) never does, nor does a
timeout while nothing else succeeds either, so tasks stay Pending/InProgress however long
an outage lasts and finish after it.

Before each batch the walk waits while the outbox holds MaxOutboxBacklog rows or more
(the relays are behind): a point change committed meanwhile then waits behind at most that
many rows, whatever the role's size, and the outbox table stays bounded. The claim is kept
alive meanwhile.

The task-level observations (`task completed`, task_lag_seconds, size, task_duration_ms)
happen once per task: for a sharded task, on the batch that completed its last shard.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final
from uuid import UUID

import msgspec
import psycopg
from opentelemetry import context as otel_context
from opentelemetry import trace
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from identity_fanout.errors import LeaseLostError, TaskSupersededError
from identity_fanout.fanout.batch import BatchResult, run_batch
from identity_fanout.fanout.metrics import FanoutMetrics
from identity_fanout.fanout.queue import FanoutQueue, Unit, retry_delay
from identity_fanout.outbox.frontier import OutboxFrontier
from identity_fanout.outbox.store import OutboxDepth
from identity_fanout.schema import OUTBOX
from identity_fanout.settings import Settings
from pin_runtime.backoff import Backoff
from pin_runtime.logging import log_event
from pin_runtime.postgres import causes, is_retriable

_log = logging.getLogger(__name__)

Conn = psycopg.Connection[TupleRow]

THROTTLE_POLL_SECONDS: Final = 0.1
"""How often a throttled walk looks at the outbox again: a relay deletes rows without a
signal, and a point change waits behind the outbox meanwhile, so the look is short."""


class Failure(StrEnum):
    """Whose fault a failed batch is."""

    OUTAGE = "outage"
    """The database or its schema is unusable for every unit alike: unreachable, restarting,
    out of connections, a table, function or privilege missing. Never the unit's fault."""
    CONTENTION = "contention"
    """A statement or lock timeout, a deadlock, a serialization failure: every unit's when a
    lock or a load hits them all, or this unit's own when its data is the slow part."""
    UNIT = "unit"
    """The unit's own: its data, or a bug it triggers. Repeats on every attempt."""


# SQLSTATEs of a schema or privilege every unit needs (a migration not run, a grant lost):
# no unit can succeed until an operator fixes it, so none of them is the unit's fault.
_SCHEMA_SQLSTATES: Final = {
    "42501": "insufficient privilege",
    "42P01": "undefined table",
    "42703": "undefined column",
    "42883": "undefined function",
    "3F000": "invalid schema name",
    "28000": "invalid authorization",
    "28P01": "invalid password",
}
_CONTENTION_SQLSTATES: Final = {
    "57014": "query canceled (statement_timeout)",
    "55P03": "lock not available (lock_timeout)",
    "40001": "serialization failure",
    "40P01": "deadlock detected",
}


def classify_failure(exc: BaseException) -> Failure:
    """The class of a failed batch, from the first psycopg error in its cause chain."""
    for current in causes(exc):
        if isinstance(current, psycopg.Error) and current.sqlstate is not None:
            if current.sqlstate in _CONTENTION_SQLSTATES:
                return Failure.CONTENTION
            if current.sqlstate in _SCHEMA_SQLSTATES:
                return Failure.OUTAGE
    return Failure.OUTAGE if is_retriable(exc) else Failure.UNIT


def counts_against_unit(failure: Failure, *, others_succeed: bool) -> bool:
    """Whether a failure takes the unit one attempt closer to poison.

    A contention failure counts only while other units succeed (this worker's batch before
    it committed, on another unit): a lock or a load that times out every batch is an
    outage, one unit whose data times out while the rest flow is that unit's poison.
    """
    if failure is Failure.UNIT:
        return True
    return failure is Failure.CONTENTION and others_succeed


class WalkEnd(StrEnum):
    """How a walk ended: what the worker loop does next."""

    COMPLETED = "completed"
    STOPPED = "released"
    LEASE_LOST = "lease_lost"
    SUPERSEDED = "superseded"
    FAILED = "failed"
    """A failure counted against the unit: it is retried after its backoff."""
    OUTAGE = "outage"
    """A failure that was not the unit's: the worker backs off before it claims again."""


class _Unrecorded(msgspec.Struct, frozen=True):
    """A failure whose record did not reach the database (it was down): tried again before
    the next claim, so an outage that also refused the record still gives the attempt back
    (unless the lease ran out and another worker claimed the unit meanwhile)."""

    unit: Unit
    reason: str
    retry_in: timedelta
    counted: bool


@dataclass(frozen=True)
class WorkerSignals:
    """Where a test watches or steers a worker; a service leaves them all at their default.

    One object for the whole worker instead of hooks threaded through each constructor.
    """

    batch: Callable[[Unit, BatchResult], None] | None = None
    """Called after each committed batch, with its unit and result."""
    clock: Callable[[], float] = time.monotonic
    """The monotonic clock of the waits (the polling interval, the backpressure's touch)."""


@dataclass(eq=False)
class Walker:
    """Walks units to their end; the same walk for a whole task and for a shard."""

    pool: ConnectionPool[Conn]
    queue: FanoutQueue
    settings: Settings
    metrics: FanoutMetrics
    _: KW_ONLY
    stop: threading.Event
    beat: Callable[[], None]
    signals: WorkerSignals = field(default_factory=WorkerSignals)
    tracer: InitVar[trace.Tracer | None] = None
    _tracer: trace.Tracer = field(init=False)
    _last_committed: UUID | None = field(init=False, default=None)
    """The unit of this worker's last batch if that batch committed; None after a failure."""
    _unrecorded: list[_Unrecorded] = field(init=False, default_factory=list)
    _outage: Backoff = field(init=False, default_factory=lambda: Backoff(maximum=60.0))
    failing: bool = field(init=False, default=False)
    """The last batch (or split) failed: an idle poll meanwhile is no successful run (the
    failing units are only out of reach for their backoff)."""
    retry_after: float = field(init=False, default=0.0)
    """Seconds the worker waits before its next claim after a failure not the unit's own
    (1 s doubling to 60 s while they go on): set by `on_failure`."""
    outbox_frontier: OutboxFrontier = field(
        init=False, default_factory=lambda: OutboxFrontier(OUTBOX)
    )
    """Where the depth looks for the outbox's head (outbox.frontier): not the first index entry,
    past every row the relays deleted that a held snapshot keeps alive."""

    def __post_init__(self, tracer: trace.Tracer | None) -> None:
        self._tracer = tracer or trace.get_tracer("identity_fanout.fanout.worker")

    def walk(self, unit: Unit) -> WalkEnd:
        """Walk ``unit`` from its Cursor to the end, or until stopped, fenced, or failing."""
        job_run_id = str(uuid.uuid4())
        attributes: dict[str, Any] = {
            "jobRunId": job_run_id,
            "batchSize": self.settings.batch_size,
            "attempt": unit.attempt,
            **unit.ids(),
        }
        with self._tracer.start_as_current_span(
            f"access-fanout {unit.kind}", attributes=attributes
        ) as span:
            # Every line of the run in the unit's span: its trace is the one its events'
            # traceparent names, and jobRunId their CorrelationId.
            log_event(_log, "job started", jobRunId=job_run_id)
            log_event(
                _log,
                f"{unit.kind} dequeued",
                jobRunId=job_run_id,
                attempt=unit.attempt,
                **unit.ids(),
            )
            while True:
                self.beat()
                if self.stop.is_set():
                    self._release(unit, job_run_id)
                    return WalkEnd.STOPPED
                try:
                    if not self._wait_for_room(unit, job_run_id):
                        self._release(unit, job_run_id)
                        return WalkEnd.STOPPED
                    with self._tracer.start_as_current_span(
                        "access-fanout batch", attributes={"batchSize": self.settings.batch_size}
                    ) as batch_span:
                        with self.pool.connection() as conn:
                            step = run_batch(
                                conn,
                                self.queue,
                                unit,
                                batch_size=self.settings.batch_size,
                                correlation_id=job_run_id,
                            )
                        batch_span.set_attribute("rows", step.users)
                    if self.signals.batch is not None:
                        self.signals.batch(unit, step)
                except TaskSupersededError as superseded:
                    self._count(unit, "superseded")
                    log_event(
                        _log,
                        "task superseded",
                        jobRunId=job_run_id,
                        attempt=unit.attempt,
                        supersededByVersion=superseded.version,
                        **unit.ids(),
                    )
                    return WalkEnd.SUPERSEDED
                except LeaseLostError:
                    self._last_committed = None
                    self.metrics.errors.labels(kind="lease_lost").inc()
                    self._count(unit, "lease_lost")
                    log_event(
                        _log,
                        "task lease lost",
                        logging.WARNING,
                        jobRunId=job_run_id,
                        attempt=unit.attempt,
                        **unit.ids(),
                    )
                    return WalkEnd.LEASE_LOST
                except Exception as exc:
                    # A bug in the data (not only an outage) fails the batch the same way:
                    # the unit is retried up to MaxAttempts and then parked as Failed,
                    # instead of crash-looping the worker and blocking every other task.
                    return self.on_failure(unit, job_run_id, exc)
                self.committed(unit.id)
                span.set_attribute("processedCount", step.task_processed_count)
                self.metrics.batches.inc()
                self.metrics.users.inc(step.users)
                log_event(
                    _log,
                    "batch processed",
                    jobRunId=job_run_id,
                    rows=step.users,
                    cursor=str(step.cursor) if step.cursor else None,
                    **unit.ids(),
                )
                if step.unit_completed and unit.shard_no is not None:
                    self.metrics.shards.labels(outcome="completed").inc()
                if step.task_completed:
                    self._on_completed(unit, job_run_id, step)
                if step.unit_completed:
                    return WalkEnd.COMPLETED

    def committed(self, unit_id: UUID) -> None:
        """Note work of this worker on ``unit_id`` that committed (a batch, a split): a
        successful run, and the outage (if one was going on) is over."""
        self._last_committed = unit_id
        self.failing = False
        self._outage.reset()
        self.metrics.last_success.set(time.time())

    # -- backpressure ---------------------------------------------------------------------

    def observe_outbox(self, depth: OutboxDepth) -> None:
        self.metrics.outbox_backlog.set(depth.rows)
        self.metrics.outbox_oldest_age_seconds.set(depth.oldest_age_seconds)

    def _outbox_depth(self) -> OutboxDepth:
        with self.pool.connection() as conn:
            depth = OUTBOX.depth(conn, self.outbox_frontier.refresh(conn))
        self.observe_outbox(depth)
        return depth

    def _wait_for_room(self, unit: Unit, job_run_id: str) -> bool:
        """Return once the outbox holds fewer than MaxOutboxBacklog rows; False if stopped
        meanwhile. LeaseLostError (or TaskSupersededError) if the claim is lost meanwhile."""
        limit = self.settings.max_outbox_backlog
        depth = self._outbox_depth()
        if depth.rows < limit:
            return True
        started = touched = self.signals.clock()
        self.metrics.throttled.set(1)
        log_event(
            _log,
            "fan-out throttled",
            jobRunId=job_run_id,
            outboxBacklog=depth.rows,
            limit=limit,
            **unit.ids(),
        )
        try:
            while depth.rows >= limit:
                self.beat()
                # Waiting for the relays is not a failed run: the relay's alerts page for it.
                self.metrics.last_success.set(time.time())
                if self.stop.wait(THROTTLE_POLL_SECONDS):
                    return False
                if self.signals.clock() - touched >= self.queue.lease.total_seconds() / 3:
                    with self.pool.connection() as conn:
                        self.queue.touch(conn, unit)
                    touched = self.signals.clock()
                depth = self._outbox_depth()
        finally:
            waited = self.signals.clock() - started
            self.metrics.throttled.set(0)
            self.metrics.throttled_seconds.inc(waited)
        log_event(
            _log,
            "fan-out resumed",
            jobRunId=job_run_id,
            outboxBacklog=depth.rows,
            waitedMs=round(waited * 1000, 1),
            **unit.ids(),
        )
        return True

    # -- endings --------------------------------------------------------------------------

    def _count(self, unit: Unit, outcome: str) -> None:
        counter = self.metrics.tasks if unit.shard_no is None else self.metrics.shards
        counter.labels(outcome=outcome).inc()

    def _on_completed(self, unit: Unit, job_run_id: str, step: BatchResult) -> None:
        now = datetime.now(UTC)
        # From the task's first claim, whole or sharded alike (the row's StartedAt).
        duration_ms = max((now - unit.task_started_at).total_seconds() * 1000, 0.0)
        lag = (now - unit.task_created_at).total_seconds()
        self.metrics.task_duration_ms.observe(duration_ms)
        self.metrics.task_lag_seconds.observe(max(lag, 0.0))
        self.metrics.size.observe(step.task_processed_count)
        self.metrics.tasks.labels(outcome="completed").inc()
        if unit.shard_no is not None:
            # The one span of a sharded task, from its first claim to its last shard's end:
            # its shards ran in several workers, each under a span of its own.
            task_span = self._tracer.start_span(
                "access-fanout task",
                context=otel_context.Context(),
                links=[trace.Link(trace.get_current_span().get_span_context())],
                start_time=int(unit.task_started_at.timestamp() * 1e9),
                attributes={
                    "jobRunId": job_run_id,
                    "taskId": str(unit.task_id),
                    "roleId": str(unit.role_id),
                    "batchSize": self.settings.batch_size,
                    "processedCount": step.task_processed_count,
                },
            )
            task_span.end()
        log_event(
            _log,
            "task completed",
            jobRunId=job_run_id,
            taskId=str(unit.task_id),
            roleId=str(unit.role_id),
            processedCount=step.task_processed_count,
            durationMs=round(duration_ms, 1),
        )

    def on_failure(self, unit: Unit, job_run_id: str, exc: BaseException) -> WalkEnd:
        """A batch (or the split) failed: log it, keep the reason, retry the unit soon.

        Counted (the unit's own failure): retried after a delay that doubles with its
        attempts. Not counted: the attempt is given back and the worker backs off.
        """
        failure = classify_failure(exc)
        others_succeed = self._last_committed not in (None, unit.id)
        counted = counts_against_unit(failure, others_succeed=others_succeed)
        self._last_committed = None
        self.failing = True
        self.metrics.errors.labels(kind="batch" if counted else "outage").inc()
        reason = f"{type(exc).__name__}: {exc}"
        log_event(
            _log,
            "task failed",
            logging.ERROR,
            jobRunId=job_run_id,
            attempt=unit.attempt,
            exception=reason,
            failure=failure.value,
            counted=counted,
            **unit.ids(),
        )
        if counted:
            retry_in = retry_delay(
                unit.attempt,
                polling_interval=self.settings.polling_interval,
                lease=self.queue.lease,
            )
        else:
            # The unit stays out of reach twice as long as the worker waits, so the next
            # claim takes another unit: whether others succeed is what tells an outage from
            # this unit's own contention.
            self.retry_after = self._outage.next_delay()
            retry_in = min(timedelta(seconds=2 * self.retry_after), self.queue.lease)
        self._record(_Unrecorded(unit, reason, retry_in, counted))
        return WalkEnd.FAILED if counted else WalkEnd.OUTAGE

    def _record(self, failure: _Unrecorded) -> bool:
        try:
            with self.pool.connection() as conn:
                self.queue.record_failure(
                    conn, failure.unit, failure.reason, failure.retry_in, counted=failure.counted
                )
        except Exception as record_exc:
            log_event(
                _log,
                "task failure not recorded",
                logging.WARNING,
                exception=repr(record_exc),
                **failure.unit.ids(),
            )
            if failure not in self._unrecorded:
                self._unrecorded.append(failure)
            return False
        return True

    def record_pending_failures(self) -> None:
        """Record the failures the database refused while it was down (before a claim)."""
        pending, self._unrecorded = self._unrecorded, []
        for failure in pending:
            self._record(failure)

    def on_poisoned(self, unit: Unit) -> None:
        """A unit that reached MaxAttempts was marked Failed (and, for a shard, its task)."""
        self.metrics.errors.labels(kind="poison").inc()
        self.metrics.tasks.labels(outcome="failed").inc()
        if unit.shard_no is not None:
            self.metrics.shards.labels(outcome="failed").inc()
        exception = (
            f"poison: {unit.attempt} attempts reached MaxAttempts; last error: {unit.last_error}"
        )
        # The claim that found it poisoned is a span of its own: its line has a trace.
        with self._tracer.start_as_current_span(
            "access-fanout poison", attributes={"attempt": unit.attempt, **unit.ids()}
        ) as span:
            span.set_status(trace.Status(trace.StatusCode.ERROR, "poison"))
            log_event(
                _log,
                "task failed",
                logging.ERROR,
                attempt=unit.attempt,
                exception=exception,
                **unit.ids(),
            )

    def _release(self, unit: Unit, job_run_id: str) -> None:
        try:
            with self.pool.connection() as conn:
                released = self.queue.release(conn, unit)
        except Exception as exc:
            released = False
            log_event(_log, "task release failed", logging.WARNING, exception=repr(exc))
        self._count(unit, "released")
        log_event(_log, "task released", jobRunId=job_run_id, released=released, **unit.ids())
