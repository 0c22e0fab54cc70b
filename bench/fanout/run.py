"""Benchmark: a 50,000-user role changes permissions; time until Kafka acknowledged all.

Measured as an operator would see it: the service runs as its own processes, once as the
chart deploys it (`worker --no-relay` and `relay`) and once as one `worker` process with
the relay in a thread; the clock starts when set-role-permissions commits and stops when
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
from pin_testkit.local import ensure_up
from pin_testkit.runtime_roles import all_logins, ensure_login, runtime_dsn
from pin_testkit.seeding import add_permissions, seed_role_with_users

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
    worker_rss_mib: float
    relay_rss_mib: float | None


# How the relay runs: the chart's default is its own process (a Deployment); `worker` alone
# runs it in a thread of the worker process instead.
TOPOLOGIES: dict[str, list[list[str]]] = {
    "relay apart (chart default)": [["worker", "--no-relay"], ["relay"]],
    "relay in the worker (one process)": [["worker"]],
}
# Each measurement changes the role's permissions anew: the set alternates between these.
PERMISSION_SETS = (["bench.read", "bench.write"], ["bench.read"])


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


def login_of(args: list[str]) -> tuple[str, ...]:
    """The runtime roles a process logs in as (as deployed: README "Database roles")."""
    if args[0] == "relay":
        return ("identity_fanout_relay",)
    if "--no-relay" in args:
        return ("identity_fanout_worker",)
    return ("identity_fanout_worker", "identity_fanout_relay")


def measure(
    dsn: str, bootstrap: str, role: UUID, *, batch_size: int, commands: list[list[str]], run: int
) -> Timings:
    env = os.environ | {
        "IDENTITY_FANOUT_KAFKA_BOOTSTRAP": bootstrap,
        "IDENTITY_FANOUT_BATCH_SIZE": str(batch_size),
        "IDENTITY_FANOUT_LOG_LEVEL": "WARNING",
    }
    script = str(Path(sys.executable).with_name("identity-fanout"))
    ports = [free_port() for _ in commands]
    processes = [
        subprocess.Popen(
            [script, *args],
            env=env
            | {
                "IDENTITY_FANOUT_METRICS_PORT": str(port),
                "IDENTITY_FANOUT_DATABASE_DSN": runtime_dsn(dsn, *login_of(args)),
            },
        )
        for args, port in zip(commands, ports, strict=True)
    ]
    try:
        with psycopg.connect(runtime_dsn(dsn, "identity_fanout_operator"), autocommit=True) as db:
            for port in ports:  # measured from idle, ready processes
                wait_for(lambda port=port: ready(port), 60)  # type: ignore[misc]
            started = time.monotonic()
            change = set_role_permissions(db, role, PERMISSION_SETS[run % 2], inline_threshold=1000)
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
            worker_rss_mib=peak_rss_mib(processes[0].pid),
            relay_rss_mib=peak_rss_mib(processes[1].pid) if len(processes) > 1 else None,
        )
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(60)


def report(users: int, batch_size: int, results: dict[str, Timings]) -> None:
    table = Table(
        title=f"identity-fanout: permissions of a {users:,}-user role change -> Kafka "
        f"(BatchSize {batch_size}; {os.cpu_count()} cores shared with PostgreSQL and Kafka)",
        title_justify="left",
    )
    table.add_column("measure")
    for name in results:
        table.add_column(name, justify="right")
    table.add_column("target", justify="right")

    def row(measure: str, values: list[str], target: str = "") -> None:
        table.add_row(measure, *values, target)

    timings = list(results.values())
    row("set-role-permissions commit", [f"{t.enqueue_ms:.0f} ms" for t in timings])
    row("commit -> task Completed", [f"{t.fanned_out - t.committed:.2f} s" for t in timings])
    row(
        "commit -> last event acked by Kafka",
        [f"{t.acknowledged - t.committed:.2f} s" for t in timings],
        "<= 10 s (SLO 5 min)",
    )
    row("throughput", [f"{users / (t.acknowledged - t.committed):,.0f} users/s" for t in timings])
    row("worker peak RSS", [f"{t.worker_rss_mib:.0f} MiB" for t in timings])
    row(
        "relay peak RSS",
        [f"{t.relay_rss_mib:.0f} MiB" if t.relay_rss_mib else "(in the worker)" for t in timings],
    )
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
        for _, groups in all_logins():
            ensure_login(admin_dsn, *groups)
        role = seed(dsn, args.users)
        results = {
            name: measure(
                dsn, bootstrap, role, batch_size=args.batch_size, commands=commands, run=run
            )
            for run, (name, commands) in enumerate(TOPOLOGIES.items())
        }
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )
    report(args.users, args.batch_size, results)


if __name__ == "__main__":
    main()
