"""Benchmark: the relay drains as fast while another session holds a snapshot the whole time.

A session idle in a REPEATABLE READ transaction (`BEGIN ...; SELECT 1;`, then nothing)
keeps every row the relay deletes after it alive for index scans: none can be marked dead,
so a statement that walks the outbox from its first index entry fetches them all from the
heap again at every run; without the outbox floor such a snapshot made a drain several
times slower (docs/design/identity-fanout.md "The outbox frontier"). This script drains the
same burst twice in one run, with one relay (`OutboxRelay.run` in a thread, the service's
defaults):

- baseline: nothing else holds a snapshot;
- held: another session opens its snapshot before the burst commits (so before any row is
  deleted) and holds it until the last row is published.

The clock runs from the burst's commit to the relay's published counter reaching it (a row
is counted after its DELETE). Beside it: the PostgreSQL backends' CPU, and, with the
snapshot still held after the drain, EXPLAIN (ANALYZE, BUFFERS) of the relay's backlog
statement from the first index entry (what a head statement without the floor does) and
from the floor, and the backends' CPU while the relay then idles `--idle` seconds on the
empty outbox. Target: held <= 1.5x baseline.

    uv run python bench/relay/held_snapshot.py [--rows 200000] [--idle 30]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

import psycopg
from idle_burst import BURST, VACUUM, backend_cpu
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from identity_fanout.app import outbox_relay
from identity_fanout.outbox.frontier import OutboxFrontier
from identity_fanout.schema import OUTBOX, migrate_database
from identity_fanout.settings import Settings
from pin_contracts.topics import USER_ACCESS_CHANGED
from pin_runtime.settings import Secret
from pin_testkit.bench import Comparison, Figure, record
from pin_testkit.databases import temporary_database
from pin_testkit.discovery import environment_or_local
from pin_testkit.topics import TopicFactory
from pin_testkit.waiting import wait_until

console = Console(width=max(120, Console().width))
PARTITIONS = 6
TARGET = 1.5
BENCHMARK = "2. relay drain with a snapshot held the whole time vs none"


Conn = psycopg.Connection[tuple[object, ...]]


def explained(db: Conn, floor: int) -> tuple[float, int]:
    """Milliseconds and shared buffers of the backlog statement counted from `floor`."""
    row = db.execute(
        ("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + OUTBOX.backlog_statement).encode(),
        {"exact_up_to": 10_000, "floor": floor},
        prepare=False,
    ).fetchone()
    plan = row[0] if row else "[]"
    plans: list[dict[str, Any]] = json.loads(plan) if isinstance(plan, str) else plan  # type: ignore[assignment]
    top = plans[0]
    buffers = int(top["Plan"]["Shared Hit Blocks"]) + int(top["Plan"]["Shared Read Blocks"])
    return float(top["Execution Time"]), buffers


class Drain:
    """One drain's figures."""

    def __init__(self, seconds: float, cpu: float) -> None:
        self.seconds = seconds
        self.cpu = cpu
        self.idle_cpu = 0.0
        """The backends' CPU-s while the relay idles after the drain (the snapshot held)."""
        self.from_head: tuple[float, int] | None = None
        self.from_floor: tuple[float, int] | None = None


def drain(dsn: str, bootstrap: str, topic: str, rows: int, *, held: bool, idle: float) -> Drain:
    registry = CollectorRegistry()
    relay = outbox_relay(
        Settings(database_dsn=Secret(dsn), kafka_bootstrap=bootstrap), registry=registry
    )
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), name="relay")
    with (
        psycopg.connect(dsn, autocommit=True) as db,
        psycopg.connect(dsn, application_name="held-snapshot") as holder,
    ):
        db.execute(VACUUM)  # empty, as autovacuum leaves it
        thread.start()
        try:
            wait_until(lambda: relay.active, 60, "the relay holds its lanes")
            if held:  # before the burst: every row the relay deletes stays for the index
                holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT 1")
            before = backend_cpu(db)
            db.execute(BURST, {"topic": topic, "rows": rows})
            started = time.monotonic()
            wait_until(
                lambda: (registry.get_sample_value("identity_outbox_published_total") or 0) >= rows,
                900,
                "the burst published",
                interval=0.05,
            )
            result = Drain(time.monotonic() - started, backend_cpu(db) - before)
            # The relay idles on the empty outbox (a read per poll, the gauges): what the
            # operator saw as PostgreSQL busy while nothing happened.
            before = backend_cpu(db)
            time.sleep(idle)
            result.idle_cpu = backend_cpu(db) - before
        finally:
            stop.set()
            thread.join(60)
        if OUTBOX.rows_by_topic(db):
            raise RuntimeError("the relay reported more rows than it deleted")
        # The head statement as it was (from the first entry), then from the floor, the
        # snapshot still held over every deleted row.
        result.from_head = explained(db, 1)
        floor = OutboxFrontier(OUTBOX)
        for _ in range(3):
            floor.step(db)
        result.from_floor = explained(db, floor.value)
        holder.rollback()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument(
        "--idle", type=float, default=30.0, help="seconds the relay idles after each drain"
    )
    args = parser.parse_args()

    services = environment_or_local()
    admin_dsn, bootstrap = services.postgres_dsn, services.kafka_bootstrap
    topics = TopicFactory(bootstrap, prefix="pin-bench-held")
    results: dict[str, Drain] = {}
    with temporary_database(admin_dsn, "pin_bench_held") as dsn:
        try:
            migrate_database(dsn)
            for setup in ("baseline", "held"):
                with console.status(f"{setup}: draining {args.rows:,} rows"):
                    topic = topics.create(
                        partitions=PARTITIONS, config=USER_ACCESS_CHANGED.config()
                    )
                    results[setup] = drain(
                        dsn, bootstrap, topic, args.rows, held=setup == "held", idle=args.idle
                    )
        finally:
            topics.delete_all()
    baseline, held = results["baseline"], results["held"]
    table = Table(
        title=f"identity-fanout relay: drain {args.rows:,} rows, a snapshot held by another "
        f"session the whole time vs none ({os.cpu_count()} cores shared with PostgreSQL and "
        f"Kafka; load average {os.getloadavg()[0]:.1f})",
        title_justify="left",
    )
    for column in ("measure", "baseline", "snapshot held", "target"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    table.add_row(
        "commit -> last row published, s",
        f"{baseline.seconds:.2f}",
        f"{held.seconds:.2f}",
        f"held <= {TARGET:.1f}x baseline",
    )
    table.add_row("  ratio", "1.00", f"{held.seconds / baseline.seconds:.2f}x", "")
    table.add_row("PostgreSQL backends, CPU-s", f"{baseline.cpu:.2f}", f"{held.cpu:.2f}", "")
    table.add_row(
        f"  then {args.idle:.0f} s idle, CPU-s",
        f"{baseline.idle_cpu:.2f}",
        f"{held.idle_cpu:.2f}",
        "",
    )
    for label, figures in (("from the first entry", "from_head"), ("from the floor", "from_floor")):
        shown = []
        for drained in (baseline, held):
            value = getattr(drained, figures)
            shown.append("-" if value is None else f"{value[0]:.2f} ms, {value[1]:,} buffers")
        table.add_row(f"backlog statement after the drain, {label}", *shown, "")
    console.print(table)
    record(
        Comparison.duration(
            f"{BENCHMARK}, {args.rows:,} rows",
            Figure("snapshot held", held.seconds),
            Figure("no snapshot", baseline.seconds),
            target=TARGET,
            note="one relay; the snapshot opened before the rows commit",
        )
    )


if __name__ == "__main__":
    main()
