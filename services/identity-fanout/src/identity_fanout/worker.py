"""The fan-out worker loop: wait for work, claim, walk the task batch by batch.

Decisions (spec: "Алгоритм", "Идемпотентность и retry"):
- woken at once by NOTIFY on enqueue, otherwise polling every PollingInterval;
- one task at a time per worker; parallel workers take disjoint tasks (SKIP LOCKED);
- a failed batch is rolled back, its reason kept on the task, and the lease shortened so
  the task is retried soon (by this or another worker) with AttemptCount + 1;
- a lost lease drops the task at once: the batch in hand is rolled back, nothing is emitted;
- a stop request is honoured between batches: the task is handed back, committed batches stay.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
from opentelemetry import trace
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from identity_fanout import queries
from identity_fanout.claim import (
    claim_task,
    is_poisoned,
    record_failure,
    release_task,
    retry_delay,
)
from identity_fanout.errors import LeaseLostError
from identity_fanout.fanout import BatchResult, process_batch
from identity_fanout.metrics import FanoutMetrics
from identity_fanout.tasks import FanOutTask
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.logging import log_event
from pin_runtime.postgres import SessionLimits, is_retriable

_log = logging.getLogger(__name__)


class WorkerConfig:
    """The parts of Settings the loop uses, as plain values (tests build them directly)."""

    def __init__(
        self,
        *,
        batch_size: int,
        polling_interval: timedelta,
        max_lease_duration: timedelta,
        max_attempts: int,
    ) -> None:
        self.batch_size = batch_size
        self.polling_interval = polling_interval
        self.max_lease_duration = max_lease_duration
        self.max_attempts = max_attempts


class FanoutWorker:
    def __init__(
        self,
        *,
        pool: ConnectionPool[psycopg.Connection[TupleRow]],
        listen_dsn: str,
        config: WorkerConfig,
        metrics: FanoutMetrics,
        stop: threading.Event,
        database: ComponentState | None = None,
        heartbeat: Heartbeat | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_batch: Callable[[FanOutTask, BatchResult], None] | None = None,
        tracer: trace.Tracer | None = None,
        session: SessionLimits | None = None,
    ) -> None:
        self._pool = pool
        self._listen_dsn = listen_dsn
        # The LISTEN connection is a session of its own: bounded like the pool's.
        self._session = session or SessionLimits()
        self._config = config
        self._metrics = metrics
        self._stop = stop
        self._database = database or ComponentState(initial=None)
        self._heartbeat = heartbeat
        self._clock = clock
        self._on_batch = on_batch
        self._tracer = tracer or trace.get_tracer("identity_fanout.worker")
        self._listener: psycopg.Connection[TupleRow] | None = None

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        """Work until the stop event is set; then return (the current task handed back)."""
        failures = 0
        while not self._stop.is_set():
            self._beat()
            try:
                worked = self.run_once()
            except Exception as exc:
                if not is_retriable(exc):
                    raise
                failures += 1
                self._metrics.errors.labels(kind="poll").inc()
                self._database.degraded(f"{type(exc).__name__}: {exc}")
                log_event(_log, "poll failed", logging.WARNING, exception=repr(exc))
                self._close_listener()
                delay = retry_delay(
                    failures,
                    polling_interval=self._config.polling_interval,
                    lease=timedelta(seconds=60),
                )
                self._stop.wait(delay.total_seconds())
                continue
            failures = 0
            self._database.ok()
            self._metrics.last_success.set(time.time())
            if not worked:
                self._wait_for_work()
        self._close_listener()

    def run_once(self) -> bool:
        """Refresh the queue gauges, then claim and process one task; False if none."""
        self.refresh_gauges()
        with self._pool.connection() as conn:
            task = claim_task(
                conn,
                lease=self._config.max_lease_duration,
                max_attempts=self._config.max_attempts,
            )
        if task is None:
            return False
        if is_poisoned(task):
            self._on_poisoned(task)
            return True
        self.process_task(task)
        return True

    def refresh_gauges(self) -> None:
        with self._pool.connection() as conn:
            row = conn.execute(queries.QUEUE_STATE).fetchone()
        if row is not None:
            backlog, leased, failed, oldest = row
            self._metrics.queue_backlog.set(backlog)
            self._metrics.leased_tasks.set(leased)
            self._metrics.failed_tasks.set(failed)
            self._metrics.oldest_task_age_seconds.set(float(oldest or 0))

    # -- one task -------------------------------------------------------------------------

    def process_task(self, task: FanOutTask) -> None:
        """Walk ``task`` from its Cursor to the end, or until stopped, fenced, or failing."""
        job_run_id = str(uuid.uuid4())
        started = self._clock()
        log_event(_log, "job started", jobRunId=job_run_id)
        log_event(
            _log,
            "task dequeued",
            jobRunId=job_run_id,
            taskId=str(task.id),
            roleId=str(task.role_id),
            attempt=task.attempt_count,
        )
        with self._tracer.start_as_current_span(
            "access-fanout task",
            attributes={
                "jobRunId": job_run_id,
                "taskId": str(task.id),
                "roleId": str(task.role_id),
                "batchSize": self._config.batch_size,
                "attempt": task.attempt_count,
            },
        ) as span:
            processed = task.processed_count
            while True:
                self._beat()
                if self._stop.is_set():
                    self._release(task, job_run_id)
                    break
                try:
                    with self._tracer.start_as_current_span(
                        "access-fanout batch", attributes={"batchSize": self._config.batch_size}
                    ) as batch_span:
                        with self._pool.connection() as conn:
                            result = process_batch(
                                conn,
                                task,
                                batch_size=self._config.batch_size,
                                lease=self._config.max_lease_duration,
                                correlation_id=job_run_id,
                            )
                        batch_span.set_attribute("rows", result.users)
                except LeaseLostError:
                    self._metrics.errors.labels(kind="lease_lost").inc()
                    self._metrics.tasks.labels(outcome="lease_lost").inc()
                    log_event(
                        _log,
                        "task lease lost",
                        logging.WARNING,
                        jobRunId=job_run_id,
                        taskId=str(task.id),
                        roleId=str(task.role_id),
                        attempt=task.attempt_count,
                    )
                    break
                except Exception as exc:
                    # A bug in the data (not only an outage) fails the batch the same way:
                    # the task is retried up to MaxAttempts and then parked as Failed,
                    # instead of crash-looping the worker and blocking every other task.
                    self._on_batch_failed(task, job_run_id, exc)
                    break
                processed = result.processed_count
                span.set_attribute("processedCount", processed)
                self._metrics.batches.inc()
                self._metrics.users.inc(result.users)
                log_event(
                    _log,
                    "batch processed",
                    jobRunId=job_run_id,
                    taskId=str(task.id),
                    roleId=str(task.role_id),
                    rows=result.users,
                    cursor=str(result.cursor) if result.cursor else None,
                )
                if self._on_batch is not None:
                    self._on_batch(task, result)
                if result.completed:
                    self._on_completed(task, job_run_id, started, result.created_at, processed)
                    break

    def _on_completed(
        self,
        task: FanOutTask,
        job_run_id: str,
        started: float,
        created_at: datetime,
        processed: int,
    ) -> None:
        duration_ms = (self._clock() - started) * 1000
        lag = (datetime.now(UTC) - created_at).total_seconds()
        self._metrics.task_duration_ms.observe(duration_ms)
        self._metrics.task_lag_seconds.observe(max(lag, 0.0))
        self._metrics.size.observe(processed)
        self._metrics.tasks.labels(outcome="completed").inc()
        log_event(
            _log,
            "task completed",
            jobRunId=job_run_id,
            taskId=str(task.id),
            roleId=str(task.role_id),
            processedCount=processed,
            durationMs=round(duration_ms, 1),
        )

    def _on_batch_failed(self, task: FanOutTask, job_run_id: str, exc: BaseException) -> None:
        self._metrics.errors.labels(kind="batch").inc()
        log_event(
            _log,
            "task failed",
            logging.ERROR,
            jobRunId=job_run_id,
            taskId=str(task.id),
            roleId=str(task.role_id),
            attempt=task.attempt_count,
            exception=f"{type(exc).__name__}: {exc}",
        )
        retry_in = retry_delay(
            task.attempt_count,
            polling_interval=self._config.polling_interval,
            lease=self._config.max_lease_duration,
        )
        try:
            with self._pool.connection() as conn:
                record_failure(conn, task, f"{type(exc).__name__}: {exc}", retry_in)
        except Exception as record_exc:
            log_event(
                _log,
                "task failure not recorded",
                logging.WARNING,
                taskId=str(task.id),
                exception=repr(record_exc),
            )

    def _on_poisoned(self, task: FanOutTask) -> None:
        self._metrics.errors.labels(kind="poison").inc()
        self._metrics.tasks.labels(outcome="failed").inc()
        log_event(
            _log,
            "task failed",
            logging.ERROR,
            taskId=str(task.id),
            roleId=str(task.role_id),
            attempt=task.attempt_count,
            exception=f"poison: {task.attempt_count} attempts reached MaxAttempts; "
            f"last error: {task.last_error}",
        )

    def _release(self, task: FanOutTask, job_run_id: str) -> None:
        try:
            with self._pool.connection() as conn:
                released = release_task(conn, task)
        except Exception as exc:
            released = False
            log_event(_log, "task release failed", logging.WARNING, exception=repr(exc))
        self._metrics.tasks.labels(outcome="released").inc()
        log_event(
            _log,
            "task released",
            jobRunId=job_run_id,
            taskId=str(task.id),
            roleId=str(task.role_id),
            released=released,
        )

    # -- waiting --------------------------------------------------------------------------

    def _wait_for_work(self) -> None:
        """Sleep until NOTIFY, the polling interval, or a stop request, whichever is first."""
        deadline = self._clock() + self._config.polling_interval.total_seconds()
        listener = self._listen()
        while not self._stop.is_set():
            remaining = deadline - self._clock()
            if remaining <= 0:
                return
            # Short slices so a stop request is seen within half a second.
            slice_seconds = min(remaining, 0.5)
            if listener is None:
                self._stop.wait(slice_seconds)
                continue
            try:
                for _ in listener.notifies(timeout=slice_seconds, stop_after=1):
                    return
            except psycopg.Error:
                self._close_listener()
                listener = None
            self._beat()

    def _listen(self) -> psycopg.Connection[TupleRow] | None:
        if self._listener is not None and not self._listener.closed:
            return self._listener
        try:
            self._listener = psycopg.connect(
                self._listen_dsn,
                autocommit=True,
                connect_timeout=5,
                **self._session.connect_kwargs(),
            )
            self._listener.execute(f"LISTEN {queries.TASKS_CHANNEL}")
        except psycopg.Error as exc:
            log_event(_log, "listen failed; polling only", logging.WARNING, exception=repr(exc))
            self._close_listener()
        return self._listener

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _beat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.beat()
