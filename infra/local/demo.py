"""`make demo`: the system on this machine, shown to a person.

Brings PostgreSQL and Kafka up (or reuses them), shows what runs where, then runs the
identity fan-out as an operator would: migrates `pin_identity`, starts
`identity-fanout worker` as its own process, seeds a role of 20,000 users, changes the
role's permissions with `identity-fanout roles set-permissions`, follows the task and the
relay with progress bars, reads the events back from Kafka, and stops what it started.
"""

from __future__ import annotations

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

import msgspec
import psycopg
from confluent_kafka import Consumer, TopicPartition
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from identity_fanout.schema import migrate_database
from identity_fanout.seed import add_permissions, seed_role_with_users
from pin_contracts import decode_access_changed
from pin_contracts.topics import CATALOGUE, USER_ACCESS_CHANGED
from pin_runtime.kafka import create_admin
from pin_testkit.local import LocalServices, ensure_up

DEMO_USERS = 20_000
console = Console()


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return bool(response.status == HTTPStatus.OK)
    except OSError:
        return False


def _await(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(0.1)


def show_infrastructure(services: LocalServices) -> None:
    with psycopg.connect(services.postgres_dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        databases = [
            name
            for (name,) in conn.execute(
                "SELECT datname FROM pg_database WHERE datname IN ('pin_identity', 'pin_rewards') "
                "ORDER BY 1"
            )
        ]
    metadata = create_admin(services.kafka_bootstrap, client_id="pin-demo").list_topics(timeout=10)
    servers = Table(title="Infrastructure", title_justify="left")
    for column in ("service", "address", "state"):
        servers.add_column(column)
    servers.add_row(
        "PostgreSQL",
        services.postgres_dsn,
        f"{version[0] if version else '?'}; databases: {', '.join(databases)}",
    )
    servers.add_row(
        "Apache Kafka (KRaft)",
        services.kafka_bootstrap,
        f"{len(metadata.brokers)} broker(s); topics: "
        + ", ".join(
            f"{t.name} ({len(metadata.topics[t.name].partitions)})"
            for t in CATALOGUE
            if t.name in metadata.topics
        ),
    )
    console.print(servers)


def _high_watermarks(bootstrap: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{uuid.uuid4()}"})
    try:
        partitions = (
            consumer.list_topics(USER_ACCESS_CHANGED.name, timeout=10)
            .topics[USER_ACCESS_CHANGED.name]
            .partitions
        )
        return {
            p: consumer.get_watermark_offsets(TopicPartition(USER_ACCESS_CHANGED.name, p), 10)[1]
            for p in partitions
        }
    finally:
        consumer.close()


def _read_back(bootstrap: str, start: dict[int, int], version: int) -> tuple[int, object]:
    """Events of this change on the topic (from the offsets before it), and one sample."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"demo-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    end = _high_watermarks(bootstrap)
    try:
        consumer.assign([TopicPartition(USER_ACCESS_CHANGED.name, p, o) for p, o in start.items()])
        remaining = sum(end[p] - start[p] for p in start)
        matched, sample = 0, None
        deadline = time.monotonic() + 60
        while remaining > 0 and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=5000, timeout=1.0):
                if message.error() is not None:
                    continue
                remaining -= 1
                event = decode_access_changed(message.value())
                if event.payload.version == version:
                    matched += 1
                    sample = sample or event
        return matched, sample
    finally:
        consumer.close()


def _follow(dsn: str, task_id: str) -> str:
    """Progress bars of the task and of the relay until both are done; the final status."""
    with (
        psycopg.connect(dsn, autocommit=True) as db,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
    ):
        fanned = progress.add_task("users fanned out", total=DEMO_USERS)
        published = progress.add_task("events acknowledged by Kafka", total=DEMO_USERS)
        while True:
            row = db.execute(
                "SELECT status, processed_count, (SELECT count(*) FROM identity.outbox) "
                "FROM identity.access_fanout_tasks WHERE id = %s",
                (task_id,),
            ).fetchone()
            if row is None:
                raise RuntimeError(f"task {task_id} vanished")
            status, processed, waiting = row
            progress.update(fanned, completed=processed)
            progress.update(published, completed=max(0, processed - waiting))
            if status in ("Completed", "Failed") and waiting == 0:
                return str(status)
            time.sleep(0.2)  # a person watches: five refreshes a second


def fan_out(services: LocalServices) -> None:
    dsn = services.identity_dsn
    migrate_database(dsn)
    with console.status(f"seeding a role of {DEMO_USERS:,} users"), psycopg.connect(dsn) as db:
        role, _ = seed_role_with_users(
            db, users=DEMO_USERS, other_roles=2, code=f"demo-{uuid.uuid4().hex[:6]}"
        )
        add_permissions(db, ["deals.read", "deals.approve"])
    port = _free_port()
    env = os.environ | {
        "IDENTITY_FANOUT_DATABASE_DSN": dsn,
        "IDENTITY_FANOUT_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
        "IDENTITY_FANOUT_METRICS_PORT": str(port),
        "IDENTITY_FANOUT_LOG_LEVEL": "WARNING",
    }
    console.print(f"starting [bold]identity-fanout worker[/bold] (metrics on :{port})")
    worker = subprocess.Popen([_bin("identity-fanout"), "worker"], env=env)
    try:
        _await(lambda: _ready(port), 60, "worker ready")
        before = _high_watermarks(services.kafka_bootstrap)
        command = [
            _bin("identity-fanout"),
            "roles",
            "set-permissions",
            str(role),
            "deals.read",
            "deals.approve",
        ]
        console.print("$ identity-fanout roles set-permissions ROLE deals.read deals.approve")
        started = time.monotonic()
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        console.print(result.stdout.strip())
        task_id = result.stdout.strip().rsplit(" ", 1)[-1]
        status = _follow(dsn, task_id)
        with psycopg.connect(dsn) as db:
            role_version = db.execute(
                "SELECT version FROM identity.role_definitions WHERE id = %s", (role,)
            ).fetchone()
        elapsed = time.monotonic() - started
        version = role_version[0] if role_version else 0
        events, sample = _read_back(services.kafka_bootstrap, before, version)
    finally:
        worker.terminate()
        worker.wait(60)

    summary = Table(title="Access fan-out", title_justify="left", show_header=False)
    summary.add_column("what", style="bold")
    summary.add_column("value")
    summary.add_row("role", f"{role} (version {version})")
    summary.add_row("task", f"{task_id}: {status}")
    summary.add_row("events on pin.identity.access.v1", f"{events:,} (one per user)")
    summary.add_row("commit -> all acknowledged", f"{elapsed:.1f} s")
    summary.add_row("worker metrics", f"http://127.0.0.1:{port}/metrics (while it runs)")
    console.print(summary)
    if sample is not None:
        console.print("one event, as consumers receive it:")
        console.print_json(data=msgspec.to_builtins(sample))
    console.print(f"worker stopped (SIGTERM, exit code {worker.returncode})")


def main() -> None:
    with console.status("starting PostgreSQL and Kafka (first run fetches Kafka from Maven)"):
        services = ensure_up()
    show_infrastructure(services)
    fan_out(services)
    console.print(
        "\n[bold]The servers keep running[/bold] for tests and experiments:\n"
        f"  export PIN_POSTGRES_DSN='{services.postgres_dsn}'\n"
        f"  export PIN_KAFKA_BOOTSTRAP='{services.kafka_bootstrap}'\n"
        "  make down   # stops both"
    )


if __name__ == "__main__":
    main()
