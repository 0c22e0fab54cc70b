"""A fan-out worker under test, as `FanoutWorker` is built by the service, with the knobs
the tests turn (batch and shard sizes, attempts, lease, polling, hooks, readiness, session
limits, tracer), a hook that stops it after a number of batches, and the queued task it works on.

Imported by the test modules (the root pyproject's pytest ``pythonpath`` lists this directory).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from opentelemetry import trace
from prometheus_client import CollectorRegistry
from psycopg.rows import TupleRow, dict_row
from psycopg_pool import ConnectionPool

from identity_fanout.fanout.batch import BatchResult
from identity_fanout.fanout.config import (
    DEFAULT_MAX_OUTBOX_BACKLOG,
    DEFAULT_SHARD_SIZE,
    WorkerConfig,
)
from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.fanout.metrics import FanoutMetrics
from identity_fanout.fanout.shards import ClaimedShard
from identity_fanout.fanout.tasks import FanOutTask
from identity_fanout.fanout.worker import FanoutWorker
from pin_runtime.http import ComponentState
from pin_runtime.postgres import SessionLimits
from pin_testkit.seeding import add_permissions

__all__ = ["Running", "enqueue", "new_worker", "stop_after", "task_row"]

Conn = psycopg.Connection[TupleRow]


def new_worker(
    dsn: str,
    pool: ConnectionPool[Conn],
    stop: threading.Event | None = None,
    *,
    batch_size: int = 50,
    shard_size: int = DEFAULT_SHARD_SIZE,
    max_outbox_backlog: int = DEFAULT_MAX_OUTBOX_BACKLOG,
    max_attempts: int = 5,
    lease: timedelta = timedelta(minutes=5),
    polling: timedelta = timedelta(seconds=30),
    registry: CollectorRegistry | None = None,
    on_batch: Callable[[FanOutTask, BatchResult], None] | None = None,
    on_shard_batch: Callable[[ClaimedShard, BatchResult], None] | None = None,
    database: ComponentState | None = None,
    session: SessionLimits | None = None,
    tracer: trace.Tracer | None = None,
) -> tuple[FanoutWorker, FanoutMetrics]:
    """A worker on `pool` listening on `dsn`, and its metrics (on `registry` or its own)."""
    metrics = FanoutMetrics(registry or CollectorRegistry())
    worker = FanoutWorker(
        pool=pool,
        listen_dsn=dsn,
        config=WorkerConfig(
            batch_size=batch_size,
            polling_interval=polling,
            max_lease_duration=lease,
            max_attempts=max_attempts,
            shard_size=shard_size,
            max_outbox_backlog=max_outbox_backlog,
        ),
        metrics=metrics,
        on_batch=on_batch,
        on_shard_batch=on_shard_batch,
        stop=stop or threading.Event(),
        database=database,
        session=session,
        tracer=tracer,
    )
    return worker, metrics


class Running:
    """Worker threads until the block ends (stopped, joined, never leaked)."""

    def __init__(self, *workers: FanoutWorker, stop: threading.Event) -> None:
        self._threads = [threading.Thread(target=w.run) for w in workers]
        self._stop = stop

    def __enter__(self) -> Running:
        for thread in self._threads:
            thread.start()
        return self

    def alive(self) -> bool:
        return all(t.is_alive() for t in self._threads)

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        assert not any(t.is_alive() for t in self._threads)


def stop_after(batches: int, stop: threading.Event) -> Callable[[object, object], None]:
    """An ``on_batch`` / ``on_shard_batch`` hook that sets ``stop`` once ``batches`` batches
    have committed, as SIGTERM would: the loop notices before it starts the next one."""
    committed = 0

    def hook(_unit: object, _result: object) -> None:
        nonlocal committed
        committed += 1
        if committed == batches:
            stop.set()

    return hook


def enqueue(db: Conn, operator: Conn, role_id: uuid.UUID) -> uuid.UUID:
    """Change the role's permissions with an inline threshold of 0: always a queued task.

    `db` (the owner) adds the permission code to the catalogue; `operator` runs the command.
    """
    code = f"perm.{uuid.uuid4().hex[:8]}"
    add_permissions(db, [code])
    change = set_role_permissions(operator, role_id, [code], inline_threshold=0)
    assert change.task_id is not None
    return change.task_id


def task_row(db: Conn, task_id: uuid.UUID) -> dict[str, Any]:
    """The task's row, by column name."""
    with db.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT * FROM identity.access_fanout_tasks WHERE id = %s", (task_id,)
        ).fetchone()
    assert row is not None
    return row
