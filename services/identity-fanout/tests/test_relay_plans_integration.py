"""The relay's lane read keeps a plan fit for a burst after idling on an empty outbox.

An idle relay runs its read on the same connection at every poll and finds nothing. Had
psycopg prepared it, PostgreSQL's plan cache would switch it to a generic plan made while
the outbox was empty (a sequential scan and a sort of the whole table) and keep it for the
next burst. The read is therefore never prepared: every read is planned for its own
parameters and the outbox as it is. Checked on the relay's own connection (its runtime
role), with the plan cache's counters and EXPLAIN, never with a clock.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.rows import TupleRow

from identity_fanout.outbox.lanes import slots_of
from identity_fanout.outbox.pump import ReadRequest, fetch
from identity_fanout.schema import OUTBOX_TABLES
from pin_runtime.postgres import SessionLimits, connect
from pin_runtime.sql import load_queries

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
BURST = 30_000
IDLE_READS = 40
"""Far more than psycopg's prepare_threshold (5) plus PostgreSQL's five custom plans."""
EVERY_SLOT = ReadRequest(tuple(slots_of(range(8), 8)), 0, 5000, 32 * 1024 * 1024)

_q = load_queries("identity_fanout", "outbox/sql/relay.sql")
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


def read_statements(conn: Conn) -> list[tuple[str, int, int]]:
    """The plan cache's counters of the lane read, if this session prepared it."""
    rows = conn.execute(
        "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements"
        " WHERE statement LIKE '%%key_slot = ANY%%'"
    ).fetchall()
    return [(str(name), int(str(g)), int(str(c))) for name, g, c in rows]


def plan_of_read(conn: Conn, request: ReadRequest) -> str:
    """EXPLAIN of the exact read with these parameters, as this session plans it."""
    params = request._asdict() | {"slots": list(request.slots)}
    lines = conn.execute(b"EXPLAIN " + READ_LANES.encode(), params, prepare=False)
    return "\n".join(str(line[0]) for line in lines)


def test_an_idle_relay_reads_a_burst_along_an_index_never_with_a_generic_plan(
    db: Conn, relay_dsn: str
) -> None:
    db.execute("VACUUM ANALYZE identity.outbox")  # empty, as autovacuum leaves it
    with connect(relay_dsn, SessionLimits()) as relay:
        for _ in range(IDLE_READS):  # an idle relay: one empty read per poll
            assert fetch(relay, READ_LANES, EVERY_SLOT) == []
        write_burst(db, BURST)

        first = fetch(relay, READ_LANES, EVERY_SLOT)
        after = fetch(relay, READ_LANES, EVERY_SLOT._replace(after=first[-1].id))
        assert (len(first), len(after)) == (5000, 5000)
        assert first[-1].id < after[0].id

        # No generic plan ever served the read: it is not prepared at all.
        assert [s for s in read_statements(relay) if s[1] > 0] == []
        plan = plan_of_read(relay, EVERY_SLOT._replace(after=first[-1].id))
        assert "Index Scan" in plan, plan
        assert "Seq Scan" not in plan, plan
        assert "Sort" not in plan, plan
