"""Benchmark: a relay that idled on an empty outbox drains the next burst as fast as a fresh one.

An idle relay reads its lanes at every poll (`RELAY_POLL_INTERVAL`) and finds nothing. Its
lane read is one statement run again and again on one connection; a statement that psycopg
prepared (after its prepare threshold, 5 executions) gets a generic plan from PostgreSQL's plan
cache after five custom ones when it looks no dearer, and a generic plan made while the
outbox was empty and analyzed (reltuples 0) scans and sorts the whole table at every read.
This script measures the drain of a burst by one relay (`OutboxRelay.run` in a thread, the
service's defaults but a shorter poll):

- fresh: the relay starts, takes its lanes, and the burst commits a second later;
- idle: the relay starts and idles `--idle` seconds (one empty read per poll), then the
  burst commits.

The clock runs from the burst's commit to the relay's published counter reaching it (a row
is counted after its DELETE, which follows the broker's ack). The relay's PostgreSQL
backends' CPU (every backend of the benchmark's database) is read from /proc where the
server runs on this machine.

    uv run python bench/relay/idle_burst.py [--rows 200000] [--idle 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import timedelta

import psycopg
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from identity_fanout.app import outbox_relay
from identity_fanout.schema import OUTBOX, migrate_database
from identity_fanout.settings import Settings
from pin_contracts.topics import USER_ACCESS_CHANGED
from pin_runtime.settings import Secret
from pin_runtime.sql import parse_queries
from pin_testkit.bench import cpu_seconds
from pin_testkit.databases import temporary_database
from pin_testkit.discovery import environment_or_local
from pin_testkit.topics import TopicFactory
from pin_testkit.waiting import wait_until

console = Console()
PARTITIONS = 6
POLL_INTERVAL = 0.5

_statements = parse_queries(
    """
-- name: burst --
-- One statement writes the burst: the relay does not decode payloads, so ~1.3 KB of opaque
-- bytes per row (the size of an access event with three assignments) is what it moves.
INSERT INTO {outbox} (topic, message_key, payload, headers, message_id, event_type, key_slot)
SELECT %(topic)s, k, convert_to(repeat('x', 1300), 'UTF8'), '[]'::jsonb, gen_random_uuid(),
       'UserAccessChanged', {key_slot}(k)
  FROM (SELECT gen_random_uuid()::text AS k FROM generate_series(1, %(rows)s)) AS users

-- name: vacuum --
VACUUM ANALYZE {outbox}
""",
    "bench/relay/idle_burst.py",
)
BURST = OUTBOX.writer_statement(_statements, "burst")
"""A burst of `rows` rows of `topic`, written as a writer of the service's outbox writes."""
VACUUM = OUTBOX.tables.compose(_statements, "vacuum")


def backend_cpu(db: psycopg.Connection[tuple[object, ...]]) -> float:
    """CPU seconds of this database's backends other than `db`'s own (the relay's)."""
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid()"
    ).fetchall()
    total = 0.0
    for (pid,) in rows:
        try:
            total += cpu_seconds(int(str(pid)))
        except OSError:  # gone, or the server runs elsewhere
            continue
    return total


def drain(dsn: str, bootstrap: str, topic: str, rows: int, idle: float) -> tuple[float, float]:
    """Seconds from the burst's commit to its last row published, and the PostgreSQL
    backends' CPU seconds meanwhile, for a relay that idled `idle` seconds before."""
    registry = CollectorRegistry()
    settings = Settings(
        database_dsn=Secret(dsn),
        kafka_bootstrap=bootstrap,
        relay_poll_interval=timedelta(seconds=POLL_INTERVAL),
    )
    relay = outbox_relay(settings, registry=registry)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), name="relay")
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(VACUUM)  # empty, as autovacuum leaves it
        thread.start()
        try:
            wait_until(lambda: relay.active, 60, "the relay holds its lanes")
            time.sleep(max(1.0, idle))
            before = backend_cpu(db)
            db.execute(BURST, {"topic": topic, "rows": rows})
            started = time.monotonic()
            wait_until(
                lambda: (registry.get_sample_value("identity_outbox_published_total") or 0) >= rows,
                600,
                "the burst published",
                interval=0.05,
            )
            took = time.monotonic() - started
            database = backend_cpu(db) - before
        finally:
            stop.set()
            thread.join(60)
        if OUTBOX.rows_by_topic(db):
            raise RuntimeError("the relay reported more rows than it deleted")
    return took, database


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds the relay idles")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    services = environment_or_local()
    admin_dsn, bootstrap = services.postgres_dsn, services.kafka_bootstrap
    topics = TopicFactory(bootstrap, prefix="pin-bench-idle")
    results: dict[str, list[tuple[float, float]]] = {"fresh": [], "idle": []}
    with temporary_database(admin_dsn, "pin_bench_idle") as dsn:
        try:
            migrate_database(dsn)
            for round_ in range(args.rounds):
                for setup, idle in (("fresh", 0.0), ("idle", args.idle)):
                    with console.status(f"round {round_ + 1}: {setup} relay"):
                        topic = topics.create(
                            partitions=PARTITIONS, config=USER_ACCESS_CHANGED.config()
                        )
                        results[setup].append(drain(dsn, bootstrap, topic, args.rows, idle))
        finally:
            topics.delete_all()
    table = Table(
        title=f"identity-fanout relay: burst of {args.rows:,} rows after {args.idle:.0f} s idle "
        f"(poll {POLL_INTERVAL} s) vs fresh; load average {os.getloadavg()[0]:.1f}",
        title_justify="left",
    )
    for column in ("relay", "commit -> last row published, s", "its PostgreSQL backends, CPU-s"):
        table.add_column(column, justify="left" if column == "relay" else "right")
    for setup, figures in results.items():
        table.add_row(
            setup,
            ", ".join(f"{took:.2f}" for took, _ in figures),
            ", ".join(f"{cpu:.2f}" for _, cpu in figures),
        )
    console.print(table)


if __name__ == "__main__":
    main()
