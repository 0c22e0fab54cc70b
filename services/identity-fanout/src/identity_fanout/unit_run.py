"""Walking one unit of work batch by batch: a whole task, or one shard of a large task.

Both walk the same way (spec "Алгоритм", "Идемпотентность и retry"): a failed batch is
rolled back, its reason kept on the unit and its lease shortened so it is retried soon with
AttemptCount + 1; a lost lease drops the unit at once (the batch in hand rolled back,
nothing emitted); a stop request is honoured between batches by handing the unit back.
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
from typing import Any
from uuid import UUID

import msgspec
import psycopg
from opentelemetry import trace
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from identity_fanout.claim import retry_delay
from identity_fanout.errors import LeaseLostError
from identity_fanout.fanout import BatchResult
from identity_fanout.metrics import FanoutMetrics
from identity_fanout.worker_config import WorkerConfig
from pin_runtime.logging import log_event

_log = logging.getLogger(__name__)

Conn = psycopg.Connection[TupleRow]


class Unit(msgspec.Struct, frozen=True, kw_only=True):
    """What a walk logs, traces and fences by."""

    task_id: UUID
    role_id: UUID
    attempt: int
    shard_no: int | None = None
    """None: the task as one unit."""

    def ids(self) -> dict[str, Any]:
        ids: dict[str, Any] = {"taskId": str(self.task_id), "roleId": str(self.role_id)}
        if self.shard_no is not None:
            ids["shardNo"] = self.shard_no
        return ids


class UnitOps(msgspec.Struct, frozen=True, kw_only=True):
    """The unit-specific parts of a walk: a batch, a hand-back, a failure record."""

    batch: Callable[[Conn, str], BatchResult]
    release: Callable[[Conn], bool]
    record_failure: Callable[[Conn, str, timedelta], bool]


@dataclass(eq=False)
class UnitRunner:
    """Walks units to their end; shared by the task and shard paths of the worker."""

    pool: ConnectionPool[Conn]
    config: WorkerConfig
    metrics: FanoutMetrics
    _: KW_ONLY
    stop: threading.Event
    beat: Callable[[], None]
    clock: Callable[[], float] = time.monotonic
    tracer: InitVar[trace.Tracer | None] = None
    _tracer: trace.Tracer = field(init=False)

    def __post_init__(self, tracer: trace.Tracer | None) -> None:
        self._tracer = tracer or trace.get_tracer("identity_fanout.worker")

    def walk(self, unit: Unit, ops: UnitOps) -> None:
        """Walk ``unit`` from its Cursor to the end, or until stopped, fenced, or failing."""
        job_run_id = str(uuid.uuid4())
        started = self.clock()
        log_event(_log, "job started", jobRunId=job_run_id)
        log_event(_log, "task dequeued", jobRunId=job_run_id, attempt=unit.attempt, **unit.ids())
        attributes: dict[str, Any] = {
            "jobRunId": job_run_id,
            "batchSize": self.config.batch_size,
            "attempt": unit.attempt,
            **unit.ids(),
        }
        with self._tracer.start_as_current_span(
            "access-fanout task", attributes=attributes
        ) as span:
            while True:
                self.beat()
                if self.stop.is_set():
                    self._release(unit, ops, job_run_id)
                    return
                try:
                    with self._tracer.start_as_current_span(
                        "access-fanout batch", attributes={"batchSize": self.config.batch_size}
                    ) as batch_span:
                        with self.pool.connection() as conn:
                            step = ops.batch(conn, job_run_id)
                        batch_span.set_attribute("rows", step.users)
                except LeaseLostError:
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
                    return
                except Exception as exc:
                    # A bug in the data (not only an outage) fails the batch the same way:
                    # the unit is retried up to MaxAttempts and then parked as Failed,
                    # instead of crash-looping the worker and blocking every other task.
                    self.on_failure(unit, ops.record_failure, job_run_id, exc)
                    return
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
                    self._on_completed(unit, job_run_id, started, step)
                if step.unit_completed:
                    return

    def _count(self, unit: Unit, outcome: str) -> None:
        counter = self.metrics.tasks if unit.shard_no is None else self.metrics.shards
        counter.labels(outcome=outcome).inc()

    def _on_completed(self, unit: Unit, job_run_id: str, started: float, step: BatchResult) -> None:
        now = datetime.now(UTC)
        if step.task_started_at is not None:
            duration_ms = (now - step.task_started_at).total_seconds() * 1000
        else:
            duration_ms = (self.clock() - started) * 1000
        lag = (now - step.created_at).total_seconds()
        self.metrics.task_duration_ms.observe(max(duration_ms, 0.0))
        self.metrics.task_lag_seconds.observe(max(lag, 0.0))
        self.metrics.size.observe(step.task_processed_count)
        self.metrics.tasks.labels(outcome="completed").inc()
        log_event(
            _log,
            "task completed",
            jobRunId=job_run_id,
            taskId=str(unit.task_id),
            roleId=str(unit.role_id),
            processedCount=step.task_processed_count,
            durationMs=round(duration_ms, 1),
        )

    def on_failure(
        self,
        unit: Unit,
        record_failure: Callable[[Conn, str, timedelta], bool],
        job_run_id: str,
        exc: BaseException,
    ) -> None:
        """A batch (or the split) failed: log it, keep the reason, retry the unit soon."""
        self.metrics.errors.labels(kind="batch").inc()
        reason = f"{type(exc).__name__}: {exc}"
        log_event(
            _log,
            "task failed",
            logging.ERROR,
            jobRunId=job_run_id,
            attempt=unit.attempt,
            exception=reason,
            **unit.ids(),
        )
        retry_in = retry_delay(
            unit.attempt,
            polling_interval=self.config.polling_interval,
            lease=self.config.max_lease_duration,
        )
        try:
            with self.pool.connection() as conn:
                record_failure(conn, reason, retry_in)
        except Exception as record_exc:
            log_event(
                _log,
                "task failure not recorded",
                logging.WARNING,
                exception=repr(record_exc),
                **unit.ids(),
            )

    def on_poisoned(self, unit: Unit, last_error: str | None) -> None:
        """A unit that reached MaxAttempts was marked Failed (and, for a shard, its task)."""
        self.metrics.errors.labels(kind="poison").inc()
        self.metrics.tasks.labels(outcome="failed").inc()
        if unit.shard_no is not None:
            self.metrics.shards.labels(outcome="failed").inc()
        log_event(
            _log,
            "task failed",
            logging.ERROR,
            attempt=unit.attempt,
            exception=f"poison: {unit.attempt} attempts reached MaxAttempts; "
            f"last error: {last_error}",
            **unit.ids(),
        )

    def _release(self, unit: Unit, ops: UnitOps, job_run_id: str) -> None:
        try:
            with self.pool.connection() as conn:
                released = ops.release(conn)
        except Exception as exc:
            released = False
            log_event(_log, "task release failed", logging.WARNING, exception=repr(exc))
        self._count(unit, "released")
        log_event(_log, "task released", jobRunId=job_run_id, released=released, **unit.ids())
