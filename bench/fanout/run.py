"""Benchmark: a 50,000-user role changes permissions; time until Kafka acknowledged all.

Measured as an operator would see it: `identity-fanout worker` runs as its own process
(with the outbox relay), the clock starts when set-role-permissions commits and stops when
the task is Completed and the relay has deleted the last outbox row (it deletes a row only
after the broker acknowledged it). Prints users/s and the worker's peak RSS.

    uv run python bench/fanout/run.py [--users 50000] [--batch-size 500]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import NamedTuple
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from rich.console import Console
from rich.table import Table

from identity_fanout.enqueue import set_role_permissions
from identity_fanout.schema import migrate_database
from identity_fanout.seed import add_permissions, seed_role_with_users
from pin_testkit.local import ensure_up

console = Console()


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return bool(response.status == HTTPStatus.OK)
    except OSError:
        return False


def wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done within {timeout}s")
        time.sleep(0.02)


class Timings(NamedTuple):
    committed: float
    enqueue_ms: float
    fanned_out: float
    acknowledged: float
    rss_mib: float


def seed(dsn: str, users: int) -> UUID:
    with console.status(f"seeding a role of {users:,} users"), psycopg.connect(dsn) as db:
        role, _ = seed_role_with_users(db, users=users, other_roles=2)
        # Other roles and users too, so the role is not the whole table.
        seed_role_with_users(db, users=users // 2, other_roles=1, code="bystanders")
        add_permissions(db, ["bench.read", "bench.write"])
        db.commit()
        db.autocommit = True  # VACUUM refuses to run in a transaction block
        db.execute("VACUUM ANALYZE identity.role_assignments")
    return role


def measure(dsn: str, bootstrap: str, role: UUID, batch_size: int) -> Timings:
    port = free_port()
    env = os.environ | {
        "IDENTITY_FANOUT_DATABASE_DSN": dsn,
        "IDENTITY_FANOUT_KAFKA_BOOTSTRAP": bootstrap,
        "IDENTITY_FANOUT_BATCH_SIZE": str(batch_size),
        "IDENTITY_FANOUT_METRICS_PORT": str(port),
        "IDENTITY_FANOUT_LOG_LEVEL": "WARNING",
    }
    worker = subprocess.Popen(
        [str(Path(sys.executable).with_name("identity-fanout")), "worker"], env=env
    )
    try:
        with psycopg.connect(dsn, autocommit=True) as db:
            wait_for(lambda: ready(port), 60)  # measured from an idle, ready worker
            started = time.monotonic()
            change = set_role_permissions(
                db, role, ["bench.read", "bench.write"], inline_threshold=1000
            )
            committed = time.monotonic()

            def task_done() -> bool:
                row = db.execute(
                    "SELECT status FROM identity.access_fanout_tasks WHERE id = %s",
                    (change.task_id,),
                ).fetchone()
                return row is not None and row[0] == "Completed"

            wait_for(task_done, 600)
            fanned_out = time.monotonic()
            wait_for(
                lambda: db.execute("SELECT count(*) FROM identity.outbox").fetchone() == (0,), 600
            )
            acknowledged = time.monotonic()
        return Timings(
            committed=committed,
            enqueue_ms=(committed - started) * 1000,
            fanned_out=fanned_out,
            acknowledged=acknowledged,
            rss_mib=peak_rss_mib(worker.pid),
        )
    finally:
        worker.terminate()
        worker.wait(60)


def report(users: int, batch_size: int, t: Timings) -> None:
    total = t.acknowledged - t.committed
    table = Table(title="identity-fanout: role permission change -> Kafka", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target / limit", justify="right")
    table.add_row("users in the role", f"{users:,}", "")
    table.add_row("batch size", str(batch_size), "spec default 500")
    table.add_row("set-role-permissions commit", f"{t.enqueue_ms:.0f} ms", "")
    table.add_row("commit -> task Completed", f"{t.fanned_out - t.committed:.2f} s", "")
    table.add_row("commit -> last event acked by Kafka", f"{total:.2f} s", "<= 10 s (SLO 5 min)")
    table.add_row("throughput", f"{users / total:,.0f} users/s", ">= 5,000 users/s")
    table.add_row("worker peak RSS", f"{t.rss_mib:.0f} MiB", "")
    table.add_row("machine", f"{os.cpu_count()} cores", "broker and PostgreSQL on the same host")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=500)
    args = parser.parse_args()

    admin_dsn = os.environ.get("PIN_POSTGRES_DSN")
    bootstrap = os.environ.get("PIN_KAFKA_BOOTSTRAP")
    if not (admin_dsn and bootstrap):
        services = ensure_up()
        admin_dsn, bootstrap = services.postgres_dsn, services.kafka_bootstrap
    dbname = f"pin_bench_fanout_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    dsn = make_conninfo(admin_dsn, dbname=dbname)
    try:
        migrate_database(dsn)
        role = seed(dsn, args.users)
        timings = measure(dsn, bootstrap, role, args.batch_size)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )
    report(args.users, args.batch_size, timings)


if __name__ == "__main__":
    main()
