"""Benchmark: relays deleting what the broker acknowledged, by id and where the rows were read.

Each relay deletes the rows of its own lanes once they are acknowledged, in batches, while
the other relays do the same with theirs; the rows of all lanes are interleaved in the
heap and in the primary key. This script measures that part alone, on PostgreSQL, without a
broker: a burst of `--rows` outbox rows (64 slots), then `--relays` threads, each with its
own connection and its lane's rows in id order, deleting them in batches of `--batch` at
the same time, with

- by id: `delete_published` (`id = ANY(ids)`, a descent of the primary key per row);
- where read: the ctid each row was read at (a read selecting `ctid` beside its columns),
  checked by its id: one heap page per row instead of a descent of the primary key.

Figures per variant (best of `--rounds`, alternating, a fresh burst on a vacuumed table
before each): wall time, the deleting backends' CPU per 100,000 rows (from /proc, where
the server runs on this machine) and shared buffers touched per row (pg_stat_database).

    uv run python bench/relay/deletes.py [--rows 400000] [--relays 8] [--batch 1000]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

import psycopg
from idle_burst import BURST, VACUUM
from rich.console import Console
from rich.table import Table

from identity_fanout.outbox.rules import slots_of
from identity_fanout.schema import OUTBOX, OUTBOX_TABLES, migrate_database
from pin_contracts.topics import USER_ACCESS_CHANGED
from pin_runtime.sql import parse_queries
from pin_testkit.bench import cpu_seconds
from pin_testkit.databases import temporary_database
from pin_testkit.discovery import environment_or_local

console = Console()
Conn = psycopg.Connection[tuple[object, ...]]

_statements = parse_queries(
    """
-- name: where_read --
-- The variant: each row deleted at the ctid its read found it, checked by its id.
DELETE FROM {outbox} AS o
 USING unnest(%(tids)s::tid[], %(ids)s::bigint[]) AS d(tid, id)
 WHERE o.ctid = d.tid AND o.id = d.id

-- name: lane_rows --
-- A lane's rows (id, ctid) in id order, as its reads would have returned them.
SELECT id, ctid::text FROM {outbox} WHERE key_slot = ANY(%(slots)s::smallint[]) ORDER BY id

-- name: empty --
TRUNCATE {outbox}
""",
    "bench/relay/deletes.py",
)
WHERE_READ, LANE_ROWS, EMPTY = (
    OUTBOX_TABLES.compose(_statements, name) for name in ("where_read", "lane_rows", "empty")
)


def lane_rows(db: Conn, relays: int) -> list[list[tuple[int, str]]]:
    """Each relay's rows (id, ctid) in id order, as its reads would have returned them."""
    lanes = []
    for lane in range(relays):
        slots = list(slots_of([lane], relays))
        rows = db.execute(LANE_ROWS, {"slots": slots}).fetchall()
        lanes.append([(int(str(i)), str(t)) for i, t in rows])
    return lanes


def by_id(conn: Conn, batch: list[tuple[int, str]]) -> int:
    return OUTBOX.delete(conn, [i for i, _ in batch])  # the relay's own delete


def where_read(conn: Conn, batch: list[tuple[int, str]]) -> int:
    ids = "{" + ",".join(str(i) for i, _ in batch) + "}"
    tids = '{"' + '","'.join(t for _, t in batch) + '"}'
    return conn.execute(WHERE_READ, {"tids": tids, "ids": ids}, prepare=False).rowcount


VARIANTS: dict[str, Callable[[Conn, list[tuple[int, str]]], int]] = {
    "by id": by_id,
    "where read": where_read,
}


def blocks_touched(db: Conn) -> int:
    db.execute("SELECT pg_stat_clear_snapshot()")
    row = db.execute(
        "SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return int(str(row[0])) if row else 0


def measure(
    dsn: str, db: Conn, variant: str, *, rows: int, relays: int, batch: int
) -> dict[str, float]:
    db.execute(EMPTY)
    db.execute(BURST, {"topic": USER_ACCESS_CHANGED.name, "rows": rows})
    db.execute(VACUUM)
    lanes = lane_rows(db, relays)
    delete = VARIANTS[variant]
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(relays)]
    pids = [int(c.info.backend_pid) for c in conns]
    deleted = [0] * relays
    start = threading.Barrier(relays + 1)

    def run(index: int) -> None:
        start.wait()
        mine = lanes[index]
        for at in range(0, len(mine), batch):
            deleted[index] += delete(conns[index], mine[at : at + batch])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(relays)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # let every stats report of the setup land
    cpu_before = sum(cpu_seconds(p) for p in pids)
    blocks_before = blocks_touched(db)
    began = time.perf_counter()
    start.wait()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    cpu = sum(cpu_seconds(p) for p in pids) - cpu_before
    for conn in conns:
        conn.close()  # each backend reports its counters as it exits
    time.sleep(1.0)  # the exited backends' counters reach the shared statistics
    blocks = blocks_touched(db) - blocks_before
    if sum(deleted) != rows:
        raise RuntimeError(f"{variant}: {sum(deleted)} rows deleted of {rows}")
    return {"wall": wall, "cpu": cpu / rows * 100_000, "blocks": blocks / rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--relays", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    admin = environment_or_local().postgres_dsn
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with temporary_database(admin, "pin_bench_deletes") as dsn:
        migrate_database(dsn)
        with psycopg.connect(dsn, autocommit=True) as db:
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    figures = measure(
                        dsn, db, variant, rows=args.rows, relays=args.relays, batch=args.batch
                    )
                    results[variant].append(figures)
                    console.print(f"{variant}: {figures}")
    table = Table(
        title=f"{args.relays} relays deleting {args.rows:,} acknowledged rows, batches of "
        f"{args.batch} (best of {args.rounds})"
    )
    for column in ("variant", "wall", "backends' CPU-s / 100,000 rows", "buffers / row"):
        table.add_column(column, justify="right")
    for variant, runs in results.items():
        table.add_row(
            variant,
            f"{min(r['wall'] for r in runs):.2f} s",
            f"{min(r['cpu'] for r in runs):.3f}",
            f"{min(r['blocks'] for r in runs):.1f}",
        )
    console.print(table)


if __name__ == "__main__":
    main()
