"""The fan-out worker loop: wait for work, claim a shard or a task, walk it.

Decisions (spec: "Алгоритм", "Идемпотентность и retry", "Параллелизм"):
- woken at once by NOTIFY on enqueue (and on a split), otherwise polling every
  PollingInterval;
- one unit at a time per worker: a shard of a large task (shards of the oldest task first)
  or, when no shard is waiting, a whole task; parallel workers take disjoint units
  (SKIP LOCKED);
- a freshly claimed task of a role above ShardSize users is split into shards at once, so
  the other workers share it (README "Sharded fan-out");
- failure, lease loss and graceful stop are handled per unit (unit_run.py).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

import psycopg
from opentelemetry import trace
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from identity_fanout.claim import (
    Claim,
    claim_shard,
    claim_task,
    is_poisoned,
    retry_delay,
    shard_claim,
    task_claim,
)
from identity_fanout.fanout import (
    BatchOptions,
    BatchResult,
    process_batch,
    process_shard_batch,
)
from identity_fanout.metrics import FanoutMetrics
from identity_fanout.shards import ClaimedShard
from identity_fanout.split import split_task, splittable
from identity_fanout.tasks import FanOutTask
from identity_fanout.unit_run import Conn, Unit, UnitOps, UnitRunner
from identity_fanout.wakeup import Wakeup
from identity_fanout.worker_config import WorkerConfig
from pin_contracts import FanOutTaskStatus
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.logging import log_event
from pin_runtime.postgres import SessionLimits, is_retriable
from pin_runtime.sql import load_queries

_log = logging.getLogger(__name__)
_tasks = load_queries("identity_fanout", "sql/tasks.sql")


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
        on_shard_batch: Callable[[ClaimedShard, BatchResult], None] | None = None,
        tracer: trace.Tracer | None = None,
        session: SessionLimits | None = None,
    ) -> None:
        self._pool = pool
        self._config = config
        self._metrics = metrics
        self._stop = stop
        self._database = database or ComponentState(initial=None)
        self._heartbeat = heartbeat
        self._on_batch = on_batch
        self._on_shard_batch = on_shard_batch
        # The LISTEN connection is a session of its own: bounded like the pool's.
        self._wakeup = Wakeup(
            dsn=listen_dsn,
            session=session or SessionLimits(),
            stop=stop,
            beat=self._beat,
            clock=clock,
        )
        self._runner = UnitRunner(
            pool, config, metrics, stop=stop, beat=self._beat, clock=clock, tracer=tracer
        )

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        """Work until the stop event is set; then return (the current unit handed back)."""
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
                self._wakeup.close()
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
                self._wakeup.wait(self._config.polling_interval)
        self._wakeup.close()

    def run_once(self) -> bool:
        """Refresh the queue gauges, then claim and walk one shard or task; False if none."""
        self.refresh_gauges()
        lease, max_attempts = self._config.max_lease_duration, self._config.max_attempts
        with self._pool.connection() as conn:
            shard = claim_shard(conn, lease=lease, max_attempts=max_attempts)
        if shard is not None:
            if shard.shard.status == FanOutTaskStatus.FAILED.value:
                self._runner.on_poisoned(_shard_unit(shard), shard.shard.last_error)
            else:
                self.process_shard(shard)
            return True
        with self._pool.connection() as conn:
            task = claim_task(conn, lease=lease, max_attempts=max_attempts)
        if task is None:
            return False
        if is_poisoned(task):
            self._runner.on_poisoned(_task_unit(task), task.last_error)
            return True
        if splittable(task) and self._split(task) != 0:
            return True  # split (or failed to): the next cycle claims a shard or a task
        self.process_task(task)
        return True

    def _split(self, task: FanOutTask) -> int:
        """Split a large task into shards; 0 if small; -1 if the split failed (retried like
        a failed batch: the claim counts as an attempt, the lease is shortened)."""
        try:
            with self._pool.connection() as conn:
                shards = split_task(conn, task, shard_size=self._config.shard_size)
        except Exception as exc:
            self._runner.on_failure(
                _task_unit(task),
                task_claim(task).record_failure,
                str(uuid.uuid4()),
                exc,
            )
            return -1
        if shards:
            log_event(
                _log, "task split", taskId=str(task.id), roleId=str(task.role_id), shards=shards
            )
        return shards

    def refresh_gauges(self) -> None:
        with self._pool.connection() as conn:
            row = conn.execute(_tasks.queue_state).fetchone()
        if row is not None:
            backlog, leased, failed, oldest = row
            self._metrics.queue_backlog.set(backlog)
            self._metrics.leased_tasks.set(leased)
            self._metrics.failed_tasks.set(failed)
            self._metrics.oldest_task_age_seconds.set(float(oldest or 0))

    # -- one unit -------------------------------------------------------------------------

    def _options(self, correlation_id: str) -> BatchOptions:
        return BatchOptions(
            batch_size=self._config.batch_size,
            lease=self._config.max_lease_duration,
            correlation_id=correlation_id,
        )

    def process_task(self, task: FanOutTask) -> None:
        """Walk ``task`` as one unit from its Cursor to the end (or stop, fence, failure)."""
        hook = self._on_batch
        on_batch = None if hook is None else functools.partial(hook, task)
        run = functools.partial(process_batch, task=task)
        self._walk(_task_unit(task), task_claim(task), run, on_batch)

    def process_shard(self, claimed: ClaimedShard) -> None:
        """Walk one shard of a large task from its cursor to its upper bound."""
        hook = self._on_shard_batch
        on_batch = None if hook is None else functools.partial(hook, claimed)
        run = functools.partial(process_shard_batch, claimed=claimed)
        self._walk(_shard_unit(claimed), shard_claim(claimed.shard), run, on_batch)

    def _walk(
        self,
        unit: Unit,
        claim: Claim,
        run: Callable[..., BatchResult],
        on_batch: Callable[[BatchResult], None] | None,
    ) -> None:
        """Walk `unit`: each batch is `run(conn, **options)`, reported to `on_batch`."""

        def batch(conn: Conn, correlation_id: str) -> BatchResult:
            result = run(conn, **self._options(correlation_id))
            if on_batch is not None:
                on_batch(result)
            return result

        ops = UnitOps(batch=batch, release=claim.release, record_failure=claim.record_failure)
        self._runner.walk(unit, ops)

    def _beat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.beat()


def _task_unit(task: FanOutTask) -> Unit:
    return Unit(task_id=task.id, role_id=task.role_id, attempt=task.attempt_count)


def _shard_unit(claimed: ClaimedShard) -> Unit:
    return Unit(
        task_id=claimed.shard.task_id,
        role_id=claimed.role_id,
        attempt=claimed.shard.attempt_count,
        shard_no=claimed.shard.shard_no,
    )
