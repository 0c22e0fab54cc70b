"""Measurement: a large role fanned out by one vs two `worker --no-relay` processes.

Clock: from the set-role-permissions commit to the task's Completed status (the outbox is
not drained: no relay runs). Compares the task as one unit (ShardSize above the role) with
the task split into shards (the default ShardSize), taken by one and by two workers.

    uv run python bench/fanout/shards.py [--users 200000] [--runs 2]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import NamedTuple
from uuid import UUID

import psycopg
from procs import (
    WORKER,
    console,
    launched,
    scratch_database,
    services,
    task_completed,
)
from rich.table import Table
from run import PERMISSION_SETS, seed

from identity_fanout.fanout.enqueue import set_role_permissions
from pin_testkit.bench import cpu_seconds
from pin_testkit.waiting import wait_until

SETUPS: dict[str, tuple[int, str]] = {
    "1 worker, one unit": (1, "100000000"),
    "1 worker, sharded": (1, "25000"),
    "2 workers, sharded": (2, "25000"),
}


SAMPLE_ACTIVITY = """
SELECT count(*) FILTER (WHERE state = 'active'),
       count(*) FILTER (WHERE state = 'active' AND wait_event_type = 'Lock')
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
"""


class Result(NamedTuple):
    seconds: float
    concurrent: float
    """Worker statements running at once, averaged over samples with at least one."""
    lock_waits: float
    """Share of those statements waiting for a lock."""
    worker_cpu: list[float]


def measure(dsn: str, role: UUID, *, workers: int, shard_size: str, run: int) -> Result:
    env = {"IDENTITY_FANOUT_SHARD_SIZE": shard_size}
    with (
        psycopg.connect(dsn, autocommit=True) as db,
        launched(dsn, [WORKER] * workers, env) as processes,
    ):
        db.execute("TRUNCATE identity.outbox")
        change = set_role_permissions(db, role, PERMISSION_SETS[run % 2], inline_threshold=1000)
        committed = time.monotonic()
        if change.task_id is None:
            raise RuntimeError(f"expected a queued task, got {change.mode}")
        task_id = change.task_id
        samples: list[tuple[int, int]] = []

        def done() -> bool:
            # Sampled with the status: worker statements running now, and how many of them
            # wait for a lock (the task row's roll-up would show up here).
            active = db.execute(SAMPLE_ACTIVITY).fetchone()
            if active is not None:
                samples.append((active[0], active[1]))
            return task_completed(db, task_id)

        wait_until(done, 900, "the task completed")
        seconds = time.monotonic() - committed
        cpu = [cpu_seconds(p.pid) for p in processes]
    busy = [s for s in samples if s[0] > 0]
    return Result(
        seconds=seconds,
        concurrent=sum(a for a, _ in busy) / max(len(busy), 1),
        lock_waits=sum(w for _, w in busy) / max(sum(a for a, _ in busy), 1),
        worker_cpu=cpu,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with scratch_database(services().admin_dsn, "pin_bench_shards") as dsn:
        role = seed(dsn, args.users)
        results: dict[str, list[Result]] = {name: [] for name in SETUPS}
        for run in range(args.runs):
            for step, (name, (workers, shard_size)) in enumerate(SETUPS.items()):
                # Each measurement must change the permission set (an identical set is a no-op).
                change = run * len(SETUPS) + step
                result = measure(dsn, role, workers=workers, shard_size=shard_size, run=change)
                results[name].append(result)
                console.print(f"{name}: {result}")
        table = Table(
            title=f"{args.users:,}-user role: commit -> task Completed "
            f"(best of {args.runs}; {os.cpu_count()} cores shared with PostgreSQL and Kafka)",
            title_justify="left",
        )
        for column in (
            "setup",
            "seconds",
            "users/s",
            "vs one unit",
            "statements at once",
            "lock waits",
            "worker CPU s",
        ):
            table.add_column(column, justify="right")
        base = min(r.seconds for r in results["1 worker, one unit"])
        for name, values in results.items():
            best = min(values, key=lambda r: r.seconds)
            table.add_row(
                name,
                f"{best.seconds:.2f}",
                f"{args.users / best.seconds:,.0f}",
                f"{base / best.seconds:.2f}x",
                f"{best.concurrent:.2f}",
                f"{best.lock_waits:.1%}",
                " + ".join(f"{c:.1f}" for c in best.worker_cpu),
            )
        console.print(table)


if __name__ == "__main__":
    main()
