"""A fan-out worker under test, as `FanoutWorker` is built by the service (from `Settings`),
with the knobs the tests turn (batch and shard sizes, attempts, lease, polling, signals,
readiness, session limits, tracer), a signal that stops it after a number of batches, and
the queued task it works on.

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
from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.fanout.metrics import FanoutMetrics
from identity_fanout.fanout.queue import Unit
from identity_fanout.fanout.worker import FanoutWorker, WorkerSignals
from identity_fanout.settings import Settings
from pin_runtime.http import ComponentState
from pin_runtime.postgres import SessionLimits
from pin_runtime.settings import Secret
from pin_testkit.seeding import add_permissions

__all__ = ["Running", "enqueue", "new_worker", "stop_after", "task_row"]

Conn = psycopg.Connection[TupleRow]


_DEFAULTS = Settings(database_dsn=Secret("dbname=x"))


def new_worker(
    dsn: str,
    pool: ConnectionPool[Conn],
    stop: threading.Event | None = None,
    *,
    batch_size: int = 50,
    shard_size: int = _DEFAULTS.shard_size,
    max_outbox_backlog: int = _DEFAULTS.max_outbox_backlog,
    max_attempts: int = 5,
    lease: timedelta = timedelta(minutes=5),
    polling: timedelta = timedelta(seconds=30),
    registry: CollectorRegistry | None = None,
    on_batch: Callable[[Unit, BatchResult], None] | None = None,
    database: ComponentState | None = None,
    session: SessionLimits | None = None,
    tracer: trace.Tracer | None = None,
) -> tuple[FanoutWorker, FanoutMetrics]:
    """A worker on `pool` listening on `dsn`, and its metrics (on `registry` or its own).

    ``on_batch`` is the worker's batch signal: called after each committed batch of any
    unit, a whole task's or a shard's (``unit.shard_no``)."""
    limits = session or SessionLimits()
    settings = Settings(
        database_dsn=Secret(dsn),
        batch_size=batch_size,
        polling_interval=polling,
        max_lease_duration=lease,
        max_attempts=max_attempts,
        shard_size=shard_size,
        max_outbox_backlog=max_outbox_backlog,
        db_statement_timeout=timedelta(seconds=limits.statement_timeout),
        db_lock_timeout=timedelta(seconds=limits.lock_timeout),
        db_idle_in_transaction_timeout=timedelta(seconds=limits.idle_in_transaction_timeout),
        db_keepalives_idle=timedelta(seconds=limits.keepalives_idle),
        db_keepalives_interval=timedelta(seconds=limits.keepalives_interval),
        db_keepalives_count=limits.keepalives_count,
    )
    metrics = FanoutMetrics(registry or CollectorRegistry())
    worker = FanoutWorker(
        settings,
        pool=pool,
        metrics=metrics,
        stop=stop or threading.Event(),
        database=database,
        signals=WorkerSignals(batch=on_batch),
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
    """An ``on_batch`` signal that sets ``stop`` once ``batches`` batches have committed,
    as SIGTERM would: the loop notices before it starts the next one."""
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
