"""The fan-out worker loop: wait for work, claim a shard or a task, walk it.

Decisions (spec: "Алгоритм", "Идемпотентность и retry", "Параллелизм"):
- woken at once by NOTIFY on enqueue (and on a split), otherwise polling every
  PollingInterval;
- one unit at a time per worker: a shard of a large task or a whole task, fair between
  tasks (the task whose turn is oldest first: its CreatedAt, or for a sharded task when a
  worker last took one of its shards), so a small role waits for at most one shard of a
  large one; parallel workers take disjoint units (SKIP LOCKED);
- a freshly claimed task of a role above ShardSize users is split into shards at once, so
  the other workers share it (docs/design/identity-fanout.md "Sharded fan-out");
- failure, lease loss, supersession, backpressure and graceful stop are handled per unit
  (unit_run.py); an outage backs the whole loop off instead.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Final

import psycopg
from opentelemetry import trace
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from identity_fanout.fanout.batch import (
    BatchOptions,
    BatchResult,
    process_batch,
    process_shard_batch,
)
from identity_fanout.fanout.claim import (
    claim_shard,
    claim_task,
    is_poisoned,
    shard_claim,
    task_claim,
)
from identity_fanout.fanout.config import WorkerConfig
from identity_fanout.fanout.metrics import FanoutMetrics
from identity_fanout.fanout.shards import ClaimedShard
from identity_fanout.fanout.split import split_task, splittable
from identity_fanout.fanout.tasks import FanOutTask
from identity_fanout.fanout.unit_run import Conn, Unit, UnitRunner, WalkEnd, classify_failure
from identity_fanout.fanout.wakeup import Wakeup
from identity_fanout.outbox.writer import outbox_depth
from pin_contracts import FanOutTaskStatus
from pin_runtime.backoff import Backoff
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.logging import log_event
from pin_runtime.postgres import SessionLimits
from pin_runtime.sql import load_queries

_log = logging.getLogger(__name__)
_tasks = load_queries("identity_fanout", "fanout/sql/tasks.sql")

OUTAGE_BACKOFF_MAX_SECONDS: Final = 60.0
"""The longest wait between two tries while the database fails every poll or batch."""


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
                self._stop.wait(self._runner.retry_after)
                continue
            backoff.reset()
            self._database.ok()
            if outcome is None:
                if not self._runner.failing:  # nothing to do: a healthy run
                    self._metrics.last_success.set(time.time())
                self._wakeup.wait(self._config.polling_interval)
        self._wakeup.close()

    def run_once(self) -> WalkEnd | None:
        """Refresh the gauges, then claim and walk one shard or task.

        None when the queue had nothing to claim; otherwise how the unit's walk ended (a
        poisoned unit or a split ends as COMPLETED: the next cycle claims again at once).
        """
        self._runner.record_pending_failures()
        self.refresh_gauges()
        lease, max_attempts = self._config.max_lease_duration, self._config.max_attempts
        with self._pool.connection() as conn:
            shard = claim_shard(conn, lease=lease, max_attempts=max_attempts)
        if shard is None:
            with self._pool.connection() as conn:
                task = claim_task(conn, lease=lease, max_attempts=max_attempts)
            if task is not None:
                return self._take_task(task)
            # The whole task the shards yielded to was claimed meanwhile by another worker.
            with self._pool.connection() as conn:
                shard = claim_shard(conn, lease=lease, max_attempts=max_attempts, fair=False)
            if shard is None:
                return None
        if shard.shard.status == FanOutTaskStatus.FAILED.value:
            self._runner.on_poisoned(_shard_unit(shard), shard.shard.last_error)
            return WalkEnd.COMPLETED
        return self.process_shard(shard)

    def _take_task(self, task: FanOutTask) -> WalkEnd:
        if is_poisoned(task):
            self._runner.on_poisoned(_task_unit(task), task.last_error)
            return WalkEnd.COMPLETED
        if splittable(task):
            split = self._split(task)
            if split is not None:
                return split  # the next cycle claims a shard (or the task again)
        return self.process_task(task)

    def _split(self, task: FanOutTask) -> WalkEnd | None:
        """Split a large task into shards; None if small (walk it whole); how it failed
        otherwise (retried like a failed batch)."""
        try:
            with self._pool.connection() as conn:
                shards = split_task(conn, task, shard_size=self._config.shard_size)
        except Exception as exc:
            return self._runner.on_failure(
                _task_unit(task), task_claim(task), str(uuid.uuid4()), exc
            )
        if not shards:
            return None
        self._runner.committed(task.id)
        log_event(
            _log,
            "task dequeued",
            attempt=task.attempt_count,
            taskId=str(task.id),
            roleId=str(task.role_id),
        )
        log_event(_log, "task split", taskId=str(task.id), roleId=str(task.role_id), shards=shards)
        return WalkEnd.COMPLETED

    def refresh_gauges(self) -> None:
        """The queue's gauges and the outbox's depth, read from the database: every worker
        reports them, so they survive every relay being down."""
        with self._pool.connection() as conn:
            row = conn.execute(_tasks.queue_state).fetchone()
            depth = outbox_depth(conn)
        self._runner.observe_outbox(depth)
        if row is not None:
            backlog, leased, failed, oldest, waiting = row
            self._metrics.queue_backlog.set(backlog)
            self._metrics.leased_tasks.set(leased)
            self._metrics.failed_tasks.set(failed)
            self._metrics.oldest_task_age_seconds.set(float(oldest or 0))
            self._metrics.oldest_waiting_seconds.set(float(waiting))

    # -- one unit -------------------------------------------------------------------------

    def _options(self, correlation_id: str) -> BatchOptions:
        return BatchOptions(
            batch_size=self._config.batch_size,
            lease=self._config.max_lease_duration,
            correlation_id=correlation_id,
        )

    def process_task(self, task: FanOutTask) -> WalkEnd:
        """Walk ``task`` as one unit from its Cursor to the end (or stop, fence, failure)."""
        hook = self._on_batch

        def batch(conn: Conn, correlation_id: str) -> BatchResult:
            result = process_batch(conn, task, **self._options(correlation_id))
            if hook is not None:
                hook(task, result)
            return result

        return self._runner.walk(_task_unit(task), task_claim(task), batch)

    def process_shard(self, claimed: ClaimedShard) -> WalkEnd:
        """Walk one shard of a large task from its cursor to its upper bound."""
        hook = self._on_shard_batch

        def batch(conn: Conn, correlation_id: str) -> BatchResult:
            result = process_shard_batch(conn, claimed, **self._options(correlation_id))
            if hook is not None:
                hook(claimed, result)
            return result

        return self._runner.walk(_shard_unit(claimed), shard_claim(claimed.shard), batch)

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
