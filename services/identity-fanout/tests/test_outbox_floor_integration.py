"""The statements that read the outbox from its head stay cheap while a snapshot is held
over many deleted rows, and the floor they start at never passes a row still to come.

A session idle in a REPEATABLE READ transaction keeps every row deleted after its snapshot
alive for index scans: none can be marked dead, so a walk from the primary key's first
entry fetches each of them from the heap again. The relay's head read, its backlog gauges
and the writers' depth start at the outbox floor instead (identity_fanout.outbox.floor).
Checked with EXPLAIN (ANALYZE, BUFFERS) on the runtime roles' own connections: the buffers
each statement touches, never a clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
import pytest
from psycopg.rows import TupleRow

from identity_fanout.outbox.floor import OutboxFloor
from identity_fanout.outbox.rules import slots_of
from identity_fanout.outbox.store import ReadRequest
from identity_fanout.schema import OUTBOX, OUTBOX_TABLES
from pin_runtime.postgres import SessionLimits, connect
from pin_runtime.sql import load_queries

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
DEAD = 100_000
"""Rows deleted under the held snapshot: a walk from the head fetches each from the heap."""
LIVE = 50
HEAD_WALK = DEAD // 50
"""Fewer buffers than a walk from the first entry touches: every heap page of the dead rows
(small rows, ~100 a page: ~4,800 buffers with the index's)."""
MOST_BUFFERS = 200
"""What a statement starting at the floor may touch: the btree's descent and the live
rows."""
EVERY_SLOT = tuple(slots_of(range(8), 8))
ONE_LANE = tuple(slots_of([3], 8))

_relay = load_queries("identity_fanout", "outbox/sql/relay.sql")
_outbox = load_queries("identity_fanout", "outbox/sql/outbox.sql")


def write(db: Conn, rows: int) -> None:
    db.execute(
        """
        INSERT INTO identity.outbox (topic, message_key, payload, headers, message_id,
                                     event_type, key_slot)
        SELECT 'pin.identity.access.v1', k, convert_to('x', 'UTF8'), '[]',
               gen_random_uuid(), 'UserAccessChanged', identity.outbox_key_slot(k)
          FROM (SELECT gen_random_uuid()::text AS k FROM generate_series(1, %s)) AS users
        """,
        (rows,),
    )


@pytest.fixture
def snapshot(identity_dsn: str) -> Iterator[Conn]:
    """Another session holding a snapshot, idle in its transaction (what the operator saw)."""
    with psycopg.connect(identity_dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        yield holder
        holder.rollback()


def buffers(conn: Conn, statement: str, params: Mapping[str, object]) -> int:
    """Shared buffers (hit + read) the statement touched, run as this session runs it."""
    (plan,) = conn.execute(
        ("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement).encode(), params, prepare=False
    ).fetchone() or (None,)
    top: dict[str, Any] = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def raise_floor(floor: OutboxFloor, conn: Conn, above: int) -> int:
    """Steps until the floor is above `above` (three suffice: candidate, check, rise)."""
    for _ in range(4):
        if floor.refresh(conn, force=True) > above:
            break
    return floor.value


def test_the_head_statements_start_at_the_floor_past_dead_rows_a_snapshot_keeps(
    db: Conn, snapshot: Conn, relay_dsn: str, worker_dsn: str
) -> None:
    write(db, DEAD + LIVE)
    (first,) = db.execute("SELECT min(id) FROM identity.outbox").fetchone() or (0,)
    last_dead = int(str(first)) + DEAD - 1
    db.execute("DELETE FROM identity.outbox WHERE id <= %s", (last_dead,))
    db.execute("ANALYZE identity.outbox")
    with (
        connect(relay_dsn, SessionLimits()) as relay,
        connect(worker_dsn, SessionLimits()) as worker,
    ):
        # Dead rows the snapshot keeps: a walk from the first entry touches every one.
        backlog = OUTBOX_TABLES.compose(_relay, "backlog")
        for _ in range(2):  # a second walk marks nothing dead either
            assert buffers(relay, backlog, {"exact_up_to": 10_000, "floor": 1}) > HEAD_WALK

        floor = OutboxFloor(OUTBOX)
        assert raise_floor(floor, relay, last_dead) == last_dead + 1
        worker_floor = OutboxFloor(OUTBOX)
        assert OUTBOX.depth(worker, worker_floor.refresh(worker)).rows == LIVE
        assert raise_floor(worker_floor, worker, last_dead) == last_dead + 1

        touched = {
            "backlog": buffers(relay, backlog, {"exact_up_to": 10_000, "floor": floor.value}),
            "depth": buffers(
                worker, OUTBOX_TABLES.compose(_outbox, "depth"), {"floor": worker_floor.value}
            ),
        }
        for name, slots in (("read_lanes", EVERY_SLOT), ("read_slot_heads", ONE_LANE)):
            request = ReadRequest(slots, floor.after, 5000, 32 * 1024 * 1024)
            params = request._asdict() | {"slots": list(slots)}
            touched[name] = buffers(relay, OUTBOX.read_statement(slots), params)
            assert OUTBOX.read(relay, request), name
        assert all(count <= MOST_BUFFERS for count in touched.values()), touched
        assert OUTBOX.depth(worker, worker_floor.refresh(worker)).rows == LIVE


def test_the_floor_never_passes_a_row_committed_late_below_rows_already_deleted(
    db: Conn, snapshot: Conn, identity_dsn: str, relay_dsn: str
) -> None:
    write(db, 10)
    with psycopg.connect(identity_dsn) as late:
        # A writer takes its id, then others write and the relays delete theirs.
        write(late, 1)
        (late_id,) = late.execute("SELECT max(id) FROM identity.outbox").fetchone()  # type: ignore[misc]
        write(db, 10)
        db.execute("DELETE FROM identity.outbox")  # every committed row published
        with connect(relay_dsn, SessionLimits()) as relay:
            floor = OutboxFloor(OUTBOX)
            for _ in range(6):  # while the writer is open, the floor stays below its row
                assert floor.refresh(relay, force=True) <= late_id
            late.commit()
            raise_floor(floor, relay, late_id)
            assert floor.value == late_id  # its row, still there, is the head
            rows = OUTBOX.read(relay, ReadRequest(EVERY_SLOT, floor.after, 5000, 1 << 20))
            assert [r.id for r in rows] == [late_id]


def test_ids_are_handed_out_in_order_as_the_floor_assumes(db: Conn) -> None:
    (cache,) = db.execute(
        "SELECT seqcache FROM pg_sequence WHERE seqrelid ="
        " pg_get_serial_sequence('identity.outbox', 'id')::regclass"
    ).fetchone() or (None,)
    assert cache == 1
