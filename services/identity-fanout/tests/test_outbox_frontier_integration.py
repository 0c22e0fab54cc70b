"""The outbox frontier: a slot is read only up to the ids whose writers have all ended, so no
row commits below what a relay read, whoever logs in and whatever the grants; and the floor
the head statements start at stays cheap past dead rows a held snapshot keeps.

Writers run as the service's own logins (not the superuser), and the frontier is looked at
by a relay login without `pg_read_all_stats`, as on a managed PostgreSQL whose DBA does not
grant it: pg_locks shows every login's writers to every login. The floor's buffers are
counted with EXPLAIN (ANALYZE, BUFFERS), never with a clock.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg import sql
from psycopg.rows import TupleRow
from relay_support import (
    RelayFactory,
    RelayThread,
    access_event,
    access_topic,
    key_in,
    slot_of,
    write,
)

from identity_fanout.db_roles import RELAY, RUNTIME_ROLES
from identity_fanout.ops.outbox import outbox_status
from identity_fanout.outbox.frontier import OutboxFrontier
from identity_fanout.outbox.rules import slots_of
from identity_fanout.outbox.store import ReadRequest
from identity_fanout.outbox.writer import outbox_message
from identity_fanout.schema import OUTBOX, OUTBOX_TABLES
from pin_contracts import decode_access_changed
from pin_runtime.db_roles import apply_runtime_roles
from pin_runtime.postgres import SessionLimits, connect
from pin_runtime.sql import load_queries
from pin_testkit.records import consume
from pin_testkit.runtime_roles import ensure_login, runtime_dsn
from pin_testkit.waiting import wait_until

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
WITHOUT_STATISTICS = "without_statistics_"
"""The role prefix of a relay group that holds the relay's grants but not
`pg_read_all_stats`."""

_relay = load_queries("identity_fanout", "outbox/sql/relay.sql")
_outbox = load_queries("identity_fanout", "outbox/sql/outbox.sql")


def write_rows(db: Conn, rows: int) -> None:
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


def write_key(writer: Conn, key: uuid.UUID, *, admin: Conn, version: int = 1) -> int:
    """One row of `key` in `writer`'s transaction, as the writers write it; its id (the last
    one handed out, read by `admin`: a writer's login may not read the outbox)."""
    OUTBOX.write(writer, [outbox_message(access_event(key, version), access_topic("t"))])
    (row_id,) = admin.execute(
        "SELECT pg_sequence_last_value('identity.outbox_id_seq')"
    ).fetchone() or (0,)
    return int(str(row_id))


@pytest.fixture
def statsless_relay_dsn(identity_dsn: str, postgres_admin_dsn: str) -> str:
    """A login with exactly the relay's grants in this database, without
    `pg_read_all_stats`: other logins' sessions show it no state or transaction start."""
    with psycopg.connect(identity_dsn, autocommit=True) as conn, conn.transaction():
        role = msgspec.structs.replace(RELAY, reads_statistics=False)
        apply_runtime_roles(conn, schema="identity", roles=[role], prefix=WITHOUT_STATISTICS)
        # That took CONNECT from PUBLIC, as `migrate` does: the service's own logins keep it.
        apply_runtime_roles(conn, schema="identity", roles=RUNTIME_ROLES)
    ensure_login(postgres_admin_dsn, WITHOUT_STATISTICS + RELAY.name)
    dsn = runtime_dsn(identity_dsn, WITHOUT_STATISTICS + RELAY.name)
    with psycopg.connect(dsn) as conn:
        granted = conn.execute("SELECT pg_has_role('pg_read_all_stats', 'USAGE')").fetchone()
    assert granted == (False,)
    return dsn


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


def settle(frontier: OutboxFrontier, conn: Conn) -> int:
    """Steps until the floor stops moving (three suffice: candidate, check, rise)."""
    for _ in range(3):
        frontier.step(conn)
    return frontier.value


def read_all(conn: Conn, frontier: OutboxFrontier, slots: tuple[int, ...]) -> list[int]:
    """Ids of what a relay holding `slots` reads from the floor up to the frontier."""
    request = ReadRequest(
        slots,
        (frontier.after,) * len(slots),
        tuple(map(frontier.upto, slots)),
        10_000,
        1 << 30,
    )
    return [r.id for r in OUTBOX.read(conn, request)]


def test_the_head_statements_start_at_the_floor_past_dead_rows_a_snapshot_keeps(
    db: Conn, snapshot: Conn, relay_dsn: str, worker_dsn: str
) -> None:
    write_rows(db, DEAD + LIVE)
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

        frontier = OutboxFrontier(OUTBOX)
        assert settle(frontier, relay) == last_dead + 1
        worker_frontier = OutboxFrontier(OUTBOX)
        assert OUTBOX.depth(worker, worker_frontier.refresh(worker)).rows == LIVE
        assert settle(worker_frontier, worker) == last_dead + 1

        touched = {
            "backlog": buffers(relay, backlog, {"exact_up_to": 10_000, "floor": frontier.value}),
            "depth": buffers(
                worker, OUTBOX_TABLES.compose(_outbox, "depth"), {"floor": worker_frontier.value}
            ),
        }
        for name, slots in (("read_lanes", EVERY_SLOT), ("read_slot_heads", ONE_LANE)):
            request = ReadRequest(
                slots,
                (frontier.after,) * len(slots),
                tuple(map(frontier.upto, slots)),
                5000,
                32 * 1024 * 1024,
            )
            touched[name] = buffers(relay, OUTBOX.read_statement(slots), request.params())
            assert OUTBOX.read(relay, request), name
        assert all(count <= MOST_BUFFERS for count in touched.values()), touched
        assert OUTBOX.depth(worker, worker_frontier.refresh(worker)).rows == LIVE


def test_an_open_writer_holds_back_its_own_slot_alone_whatever_the_readers_grants(
    db: Conn, producer_dsn: str, statsless_relay_dsn: str
) -> None:
    late_key = key_in(5)
    others = [key_in(5), key_in(5), key_in(6), key_in(7)]
    with (
        psycopg.connect(producer_dsn) as late,
        connect(statsless_relay_dsn, SessionLimits()) as relay,
    ):
        late_id = write_key(late, late_key, admin=db)  # the id taken, the transaction left open
        after = [write_key(db, key, admin=db) for key in others]  # committed at once (autocommit)
        frontier = OutboxFrontier(OUTBOX)
        settle(frontier, relay)
        # Slot 5 waits for the open writer, below its row; slots 6 and 7 are read on.
        assert frontier.upto(5) < late_id
        assert min(frontier.upto(6), frontier.upto(7)) >= max(after)
        assert frontier.waiting([5])
        assert not frontier.waiting([6, 7])
        assert frontier.value <= late_id
        assert read_all(relay, frontier, (5, 6, 7)) == after[2:]

        late.commit()
        settle(frontier, relay)
        assert frontier.upto(5) >= max(after)
        # The late row first: nothing of its slot was read past it.
        assert read_all(relay, frontier, (5,)) == [late_id, *after[:2]]


def test_an_open_writer_that_shows_its_first_id_holds_back_only_the_ids_from_there(
    db: Conn, producer_dsn: str, statsless_relay_dsn: str
) -> None:
    """In the step that sees it: no second look after the rows below it commit. Ids past
    2**32 (the first id's high bits go into the lock's first key) and a rolled-back
    savepoint (its first id goes with it) keep the bound exact; a session that set the
    trigger's setting for good shows no first id and is waited for until it ends."""
    db.execute("SELECT setval('identity.outbox_id_seq', %s)", ((1 << 32) - 2,))
    below = [write_key(db, key_in(5), admin=db) for _ in range(3)]  # 2**32 - 1 .. 2**32 + 1
    with (
        psycopg.connect(producer_dsn) as late,
        connect(statsless_relay_dsn, SessionLimits()) as relay,
    ):
        late.execute("SAVEPOINT s")
        write_key(late, key_in(5), admin=db)
        late.execute("ROLLBACK TO SAVEPOINT s")
        late_id = write_key(late, key_in(5), admin=db)
        after = write_key(db, key_in(5), admin=db)
        frontier = OutboxFrontier(OUTBOX)
        frontier.step(relay)
        assert frontier.upto(5) == late_id - 1
        assert frontier.waiting([5])
        assert read_all(relay, frontier, (5,)) == below
        late.commit()
        frontier.step(relay)
        assert frontier.upto(5) >= after
        assert not frontier.waiting([5])

        late.execute("SET pin.outbox_first_id = 'set by hand'")
        unknown = write_key(late, key_in(5), admin=db)
        frontier.step(relay)
        assert frontier.upto(5) == after  # not past the writer it cannot place
        late.rollback()
        frontier.step(relay)
        frontier.step(relay)
        assert frontier.upto(5) >= unknown


def test_a_prepared_writer_holds_its_slot_until_committed_and_a_prepared_reader_nothing(
    db: Conn, identity_dsn: str, statsless_relay_dsn: str
) -> None:
    key = key_in(9)
    with (
        psycopg.connect(identity_dsn) as writer,
        psycopg.connect(identity_dsn) as bystander,
        connect(statsless_relay_dsn, SessionLimits()) as relay,
    ):
        # A foreign writer's row in a two-phase transaction (no NOTIFY: it cannot PREPARE).
        writer.execute(
            "INSERT INTO identity.outbox (topic, message_key, payload, message_id, event_type,"
            " key_slot) VALUES ('t', %s, '\\x00', gen_random_uuid(), 'X',"
            " identity.outbox_key_slot(%s))",
            (str(key), str(key)),
        )
        (prepared_id,) = writer.execute("SELECT max(id) FROM identity.outbox").fetchone() or (0,)
        writer.execute("PREPARE TRANSACTION 'frontier-writer'")
        # Another two-phase transaction holding a transaction id, writing no outbox row.
        bystander.execute("SELECT pg_current_xact_id()")
        bystander.execute("PREPARE TRANSACTION 'frontier-bystander'")
        try:
            later = write_key(db, key_in(9), admin=db)
            elsewhere = write_key(db, key_in(10), admin=db)
            frontier = OutboxFrontier(OUTBOX)
            settle(frontier, relay)
            assert frontier.upto(9) < prepared_id
            assert frontier.upto(10) >= elsewhere  # the bystander holds nothing back
            db.execute("COMMIT PREPARED 'frontier-writer'")
            settle(frontier, relay)
            assert read_all(relay, frontier, (9,)) == [prepared_id, later]
        finally:
            left = db.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'frontier-%%'"
            ).fetchall()
            for (gid,) in left:
                db.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


def test_a_rolled_back_writer_frees_its_slot(db: Conn, producer_dsn: str, relay_dsn: str) -> None:
    with psycopg.connect(producer_dsn) as late, connect(relay_dsn, SessionLimits()) as relay:
        write_key(late, key_in(3), admin=db)
        committed = write_key(db, key_in(3), admin=db)
        frontier = OutboxFrontier(OUTBOX)
        settle(frontier, relay)
        assert frontier.upto(3) < committed
        late.rollback()
        settle(frontier, relay)
        assert read_all(relay, frontier, (3,)) == [committed]


def test_the_relay_tells_how_long_an_open_writer_has_held_one_of_its_slots(
    db: Conn, identity_dsn: str, producer_dsn: str, make_relay: RelayFactory
) -> None:
    """`identity_outbox_writer_oldest_age_seconds`, from the frontier's own steps (no statement
    and no grant of its own): a writer of a slot the instance publishes counts, one of a slot
    it does not hold never does."""
    relay = make_relay(lanes=2)
    gauge = relay.metrics.writer_oldest_age_seconds
    with (
        psycopg.connect(identity_dsn, autocommit=True) as foreign,
        psycopg.connect(producer_dsn) as elsewhere,
        psycopg.connect(producer_dsn) as late,
    ):
        # Slot 5 held by another session: the relay takes lane 0 (even slots) alone.
        foreign.execute("SELECT pg_advisory_lock(%s, 5)", (OUTBOX_TABLES.lane_lock_class,))
        relay.run_once()
        assert relay.lanes == {0}
        assert gauge._value.get() == 0
        write_key(elsewhere, key_in(5), admin=db)
        write_key(late, key_in(4), admin=db)
        relay.run_once()  # the first step that sees them
        time.sleep(1.0)
        relay.run_once()
        assert 1.0 <= gauge._value.get() < 30
        late.commit()
        relay.run_once()
        assert gauge._value.get() == 0  # slot 5's writer is still open: not its slot
        assert relay._frontier.oldest_writer_age([5]) >= 1.0


def test_a_keys_next_version_never_overtakes_one_committed_late_below_a_cursor(
    identity_dsn: str,
    producer_dsn: str,
    kafka_topic: Callable[..., str],
    kafka_bootstrap: str,
    make_relay: RelayFactory,
) -> None:
    """v1 takes the lower id and commits late, after a read went past it while other rows
    are in flight; v2 is written after v1 committed. A relay whose cursor passed v1 read v2
    at its next read and published it first (v1 was read only once the window emptied)."""
    topic = access_topic(kafka_topic(partitions=3))
    user = uuid.uuid4()
    relay = make_relay(lanes=1, read_cooldown=0)
    with psycopg.connect(producer_dsn) as late:
        OUTBOX.write(late, [outbox_message(access_event(user, 1), topic)])
        write(identity_dsn, [outbox_message(access_event(), topic) for _ in range(50)])
        # One read, its records produced and left unacknowledged (the producer is served
        # only in a later round): the window holds them while the key's versions commit.
        conn = relay._start(force=True)
        assert relay._fill(conn, relay.lanes) > 0
        late.commit()
    write(identity_dsn, [outbox_message(access_event(user, 2), topic)])
    relay._fill(conn, relay.lanes)
    while relay.run_once() > 0:
        pass
    records = consume(kafka_bootstrap, topic.name, 52)
    mine = [r for r in records if r.key() == str(user).encode()]
    assert [decode_access_changed(r.value()).payload.version for r in mine] == [1, 2]


def test_a_late_row_goes_out_while_the_relay_runs_without_the_statistics_grant(  # noqa: PLR0917
    identity_dsn: str,
    producer_dsn: str,
    statsless_relay_dsn: str,
    kafka_topic: Callable[..., str],
    kafka_bootstrap: str,
    make_relay: RelayFactory,
) -> None:
    """The relay's login cannot see the writer's session in pg_stat_activity: no row is read
    past the open one, it goes out once committed while the relay runs, its key's next
    version after it; the relay's backlog gauge and `outbox status` then agree."""
    topic = access_topic(kafka_topic(partitions=3))
    user = uuid.uuid4()
    registry = CollectorRegistry()
    relay = make_relay(dsn=statsless_relay_dsn, read_cooldown=0, registry=registry)
    with RelayThread(relay), psycopg.connect(producer_dsn) as late:
        OUTBOX.write(late, [outbox_message(access_event(user, 1), topic)])
        write(identity_dsn, [outbox_message(access_event(), topic) for _ in range(200)])
        user_slot = slot_of(str(user))
        wait_until(
            lambda: outbox_rows(identity_dsn, other_than=user_slot) == 0,
            timeout=30,
            what="every committed row of the other slots published",
        )
        late.commit()
        write(identity_dsn, [outbox_message(access_event(user, 2), topic)])
        records = consume(kafka_bootstrap, topic.name, 202, timeout=30)
        wait_until(lambda: outbox_rows(identity_dsn) == 0, timeout=10, what="the outbox emptied")
        wait_until(
            lambda: registry.get_sample_value("identity_outbox_backlog") == 0,
            timeout=10,
            what="the relay's backlog gauge at 0",
        )
        with psycopg.connect(identity_dsn, autocommit=True) as conn:
            assert outbox_status(conn, OUTBOX).backlog == 0
    mine = [r for r in records if r.key() == str(user).encode()]
    assert [decode_access_changed(r.value()).payload.version for r in mine] == [1, 2]


def outbox_rows(dsn: str, *, other_than: int = -1) -> int:
    """Rows in the outbox (committed), those of slot `other_than` left out."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM identity.outbox WHERE key_slot <> %s", (other_than,)
        ).fetchone() or (0,)
    return int(str(count))


def test_ids_follow_the_writer_lock_of_their_slot(db: Conn) -> None:
    (cache,) = db.execute(
        "SELECT seqcache FROM pg_sequence WHERE seqrelid ="
        " pg_get_serial_sequence('identity.outbox', 'id')::regclass"
    ).fetchone() or (None,)
    assert cache == 1  # ids handed out in order, one at a time
    (body,) = db.execute(
        "SELECT prosrc FROM pg_proc WHERE oid = 'identity.outbox_row_id'::regproc"
    ).fetchone() or ("",)
    assert f"pg_advisory_xact_lock_shared({OUTBOX_TABLES.writer_lock_class}," in str(body)
    assert f"pg_advisory_xact_lock_shared(\n            {OUTBOX_TABLES.first_id_lock_class} +" in (
        str(body)
    )
    db.execute("BEGIN")
    row_id = write_key(db, key_in(11), admin=db)
    held = db.execute(
        "SELECT objid::int FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint = %s"
        " AND pid = pg_backend_pid()",
        (OUTBOX_TABLES.writer_lock_class,),
    ).fetchall()
    db.execute("ROLLBACK")
    assert row_id > 0
    assert held == [(11,)]
