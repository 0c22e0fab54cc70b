"""A fan-out worker under test, as `FanoutWorker` is built by the service, with the knobs
the tests turn (batch and shard sizes, attempts, lease, polling, hooks).

Imported by the test modules (``conftest`` puts this directory on ``sys.path``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import psycopg
from prometheus_client import CollectorRegistry
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from identity_fanout.fanout import BatchResult, ShardBatchResult
from identity_fanout.metrics import FanoutMetrics
from identity_fanout.shards import ClaimedShard
from identity_fanout.tasks import FanOutTask
from identity_fanout.worker import DEFAULT_SHARD_SIZE, FanoutWorker, WorkerConfig

__all__ = ["new_worker"]

Conn = psycopg.Connection[TupleRow]


def new_worker(
    dsn: str,
    pool: ConnectionPool[Conn],
    stop: threading.Event | None = None,
    *,
    batch_size: int = 50,
    shard_size: int = DEFAULT_SHARD_SIZE,
    max_attempts: int = 5,
    lease: timedelta = timedelta(minutes=5),
    polling: timedelta = timedelta(seconds=30),
    registry: CollectorRegistry | None = None,
    on_batch: Callable[[FanOutTask, BatchResult], None] | None = None,
    on_shard_batch: Callable[[ClaimedShard, ShardBatchResult], None] | None = None,
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
        ),
        metrics=metrics,
        stop=stop or threading.Event(),
        on_batch=on_batch,
        on_shard_batch=on_shard_batch,
    )
    return worker, metrics
