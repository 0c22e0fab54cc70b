"""Every frequent statement on the outbox keeps a plan fit for a burst after idling on an
empty outbox.

An idle relay runs its read on the same connection at every poll and finds nothing; a
worker checks the outbox's depth before every batch from the first. Had psycopg prepared
them, PostgreSQL's plan cache would switch them to generic plans made while the outbox was
empty (sequential scans of the whole table, a sort) and keep them for the next burst. They
are therefore never prepared: each run is planned for its own parameters and the outbox as
it is. Checked on the runtime roles' own connections, with the plan cache's counters and
EXPLAIN, never with a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import LiteralString

import psycopg
import pytest
from psycopg.rows import TupleRow
from relay_support import read_request

from identity_fanout.outbox.records import OutboxRecord
from identity_fanout.outbox.rules import slots_of
from identity_fanout.outbox.store import MERGED_UP_TO, ReadRequest
from identity_fanout.schema import OUTBOX, OUTBOX_TABLES
from pin_runtime.postgres import SessionLimits, connect
from pin_runtime.sql import load_queries

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
BURST = 30_000
IDLE_READS = 40
"""Far more than psycopg's prepare_threshold (5) plus PostgreSQL's five custom plans."""
EVERY_SLOT = read_request(tuple(slots_of(range(8), 8)), 0, 5000, 32 * 1024 * 1024)

_q = load_queries("identity_fanout", "outbox/sql/relay.sql")
_outbox = load_queries("identity_fanout", "outbox/sql/outbox.sql")
READ_LANES = OUTBOX_TABLES.compose(_q, "read_lanes")


def write_burst(db: Conn, rows: int) -> None:
    """`rows` access-sized rows in one statement (the relay never decodes a payload)."""
    db.execute(
        """
        INSERT INTO identity.outbox (topic, message_key, payload, headers, message_id,
                                     event_type, key_slot)
        SELECT 'pin.identity.access.v1', k, convert_to(repeat('x', 1300), 'UTF8'), '[]',
               gen_random_uuid(), 'UserAccessChanged', identity.outbox_key_slot(k)
          FROM (SELECT gen_random_uuid()::text AS k FROM generate_series(1, %s)) AS users
        """,
        (rows,),
    )


def outbox_statements(conn: Conn) -> list[str]:
    """The statements on the outbox this session prepared (none should be)."""
    rows = conn.execute(
        "SELECT statement FROM pg_prepared_statements"
        " WHERE statement ~ '\"outbox\"([^_]|$)'"  # the outbox table, not its quarantine
    ).fetchall()
    return [str(statement) for (statement,) in rows]


def fetch(conn: Conn, statement: LiteralString, request: ReadRequest) -> list[OutboxRecord]:
    """The relay's read of `request` by `statement` (the walk or a merge)."""
    return OUTBOX.read(conn, request, statement=statement)


def plan_of(conn: Conn, statement: str, params: Mapping[str, object] | None = None) -> str:
    """EXPLAIN of `statement` with these parameters, as this session plans it."""
    lines = conn.execute(("EXPLAIN " + statement).encode(), params, prepare=False)
    return "\n".join(str(line[0]) for line in lines)


def plan_of_read(conn: Conn, request: ReadRequest) -> str:
    """EXPLAIN of the exact read with these parameters, as this session plans it."""
    lines = conn.execute(b"EXPLAIN " + READ_LANES.encode(), request.params(), prepare=False)
    return "\n".join(str(line[0]) for line in lines)


def test_an_idle_relay_reads_a_burst_along_an_index_never_with_a_generic_plan(
    db: Conn, relay_dsn: str
) -> None:
    db.execute("VACUUM ANALYZE identity.outbox")  # empty, as autovacuum leaves it
    with connect(relay_dsn, SessionLimits()) as relay:
        OUTBOX.join_relays(relay)  # the lanes' session, as the relay opens it
        for _ in range(IDLE_READS):  # an idle relay: one empty read per poll
            assert fetch(relay, READ_LANES, EVERY_SLOT) == []
        write_burst(db, BURST)

        first = fetch(relay, READ_LANES, EVERY_SLOT)
        after = fetch(
            relay, READ_LANES, read_request(EVERY_SLOT.slots, first[-1].id, 5000, 32 * 1024 * 1024)
        )
        assert (len(first), len(after)) == (5000, 5000)
        assert first[-1].id < after[0].id

        # No generic plan ever served the read: it is not prepared at all.
        assert outbox_statements(relay) == []
        plan = plan_of_read(
            relay, read_request(EVERY_SLOT.slots, first[-1].id, 5000, 32 * 1024 * 1024)
        )
        assert "Index Scan" in plan, plan
        assert "Seq Scan" not in plan, plan
        assert "Sort" not in plan, plan


def test_the_depth_backlog_and_deletes_are_never_prepared_so_a_burst_finds_them_on_the_index(
    db: Conn, relay_dsn: str, worker_dsn: str
) -> None:
    db.execute("VACUUM ANALYZE identity.outbox")  # empty, as autovacuum leaves it
    with (
        connect(relay_dsn, SessionLimits()) as relay,
        connect(worker_dsn, SessionLimits()) as worker,
    ):
        for _ in range(IDLE_READS):  # idle: every check finds the outbox empty
            assert OUTBOX.depth(worker).rows == 0
            assert OUTBOX.backlog(relay).rows == 0
            assert OUTBOX.delete(relay, [1, 2, 3]) == 0
        write_burst(db, BURST)

        assert OUTBOX.depth(worker).rows == BURST
        assert OUTBOX.backlog(relay).rows == BURST
        head = db.execute("SELECT id FROM identity.outbox ORDER BY id LIMIT 500").fetchall()
        assert OUTBOX.delete(relay, [int(str(i)) for (i,) in head]) == 500
        assert OUTBOX.depth(worker).rows == BURST - 500

        # None of them was prepared, so no generic plan made on the empty outbox serves
        # the burst; as planned now, each finds its rows along the primary key.
        assert outbox_statements(worker) == []
        assert outbox_statements(relay) == []
        for conn, statement, params in (
            (worker, OUTBOX_TABLES.compose(_outbox, "depth"), {"floor": 1}),
            (relay, OUTBOX_TABLES.compose(_q, "backlog"), {"exact_up_to": 10_000, "floor": 1}),
            (relay, OUTBOX_TABLES.compose(_q, "delete_published"), {"ids": "{1,2,3}"}),
        ):
            plan = plan_of(conn, statement, params)
            assert "Seq Scan" not in plan, plan
        # The depth finds the head once: that walk passes the deleted rows VACUUM has not
        # removed yet, and a throttled worker looks every 0.1 s (the newest row is the
        # primary key's other end, read backward).
        depth = plan_of(worker, OUTBOX_TABLES.compose(_outbox, "depth"), {"floor": 1})
        forward = [line for line in depth.splitlines() if "outbox_pkey" in line]
        assert sum("Backward" not in line for line in forward) == 1, depth


def test_a_relay_holding_few_slots_merges_their_heads_and_reads_what_the_walk_reads(
    db: Conn, relay_dsn: str
) -> None:
    write_burst(db, 20_000)
    one_lane = tuple(slots_of([3], 8))  # 8 slots: one instance of eight
    assert len(one_lane) <= MERGED_UP_TO < len(EVERY_SLOT.slots)
    assert OUTBOX.read_statement(EVERY_SLOT.slots) == READ_LANES
    merged = OUTBOX.read_statement(one_lane)
    assert merged != READ_LANES
    with connect(relay_dsn, SessionLimits()) as relay:
        OUTBOX.join_relays(relay)  # the lanes' session, as the relay opens it
        middle = fetch(relay, READ_LANES, EVERY_SLOT._replace(limit=10_000))[-1].id
        for after, limit, budget in (
            (0, 5000, 32 * 1024 * 1024),
            (middle, 5000, 32 * 1024 * 1024),
            (0, 700, 32 * 1024 * 1024),
            (0, 5000, 100_000),  # cut by payload bytes
            (0, 5000, 1),  # at least one row
        ):
            request = read_request(one_lane, after, limit, budget)
            walked = fetch(relay, READ_LANES, request)
            assert walked, request
            assert fetch(relay, merged, request) == walked, request
        assert fetch(relay, merged, read_request(one_lane, 10**12, 5000, 1)) == []

        plan = plan_of(
            relay,
            merged,
            read_request(one_lane, 0, 5000, 32 * 1024 * 1024).params(),
        )
        assert "Merge Append" in plan, plan
        assert "Seq Scan" not in plan, plan
