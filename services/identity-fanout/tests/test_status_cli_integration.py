"""`identity-fanout status` as an operator (and a script) reads it: the queue, the shards
being walked and the outbox, from a real PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow
from relay_support import access_event, access_topic, key_in
from worker_support import enqueue

from identity_fanout.fanout.batch import run_batch
from identity_fanout.fanout.queue import FanoutQueue
from identity_fanout.ops.outbox import outbox_status
from identity_fanout.outbox.writer import outbox_message
from identity_fanout.schema import OUTBOX
from pin_testkit.seeding import add_permissions, seed_role_with_users
from pin_testkit.service import run_cli, service_environment

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]


def status(dsn: str, *args: str, command: tuple[str, ...] = ("status",)) -> tuple[int, str, str]:
    env = service_environment(
        ("IDENTITY_FANOUT_",), IDENTITY_FANOUT_DATABASE_DSN=dsn, COLUMNS="200"
    )
    result = run_cli("identity-fanout", [*command, *args], env, timeout=60, check=False)
    return result.returncode, result.stdout, result.stderr


def outbox_json(dsn: str) -> Any:
    code, out, err = status(dsn, "--json", command=("outbox", "status"))
    assert code == 0, err
    return msgspec.json.decode(out)


def outbox_text(dsn: str) -> list[str]:
    code, out, err = status(dsn, command=("outbox", "status"))
    assert code == 0, err
    return out.splitlines()


def test_status_shows_a_split_task_a_waiting_one_and_what_the_outbox_holds(
    db: Conn, identity_dsn: str
) -> None:
    queue = FanoutQueue(lease=timedelta(minutes=5), max_attempts=5)
    split_role, _ = seed_role_with_users(db, users=90, other_roles=0)
    enqueue(db, db, split_role)
    task = queue.claim(db)
    assert task is not None
    assert queue.split(db, task, shard_size=30) == 3
    shard = queue.claim(db)
    assert shard is not None
    assert shard.shard_no is not None
    run_batch(db, queue, shard, batch_size=10, correlation_id="status-test")  # 10 events
    waiting_role, _ = seed_role_with_users(db, users=5, other_roles=0)
    enqueue(db, db, waiting_role)

    code, out, err = status(identity_dsn, "--json")
    assert code == 0, err
    shown = msgspec.json.decode(out)
    # Both tasks wait for a worker (the split one for its two unclaimed shards), the split
    # one is also being walked; nothing has failed.
    assert shown["queue"]["backlog"] == 2
    assert shown["queue"]["leased"] == 1
    assert shown["queue"]["failed"] == 0
    assert shown["queue"]["oldest_waiting_seconds"] >= 0
    assert shown["shards"] == {"InProgress": 1, "Pending": 2}
    assert shown["outbox"]["backlog"] == 10
    assert shown["outbox"]["by_topic"] == {"pin.identity.access.v1": 10}
    assert shown["outbox"]["relay_active"] is False
    assert sum(shown["outbox"]["backlog_by_lane"].values()) == 10
    # Each lane with rows says how long its oldest has waited: a stuck lane shows alone.
    ages = shown["outbox"]["oldest_age_by_lane"]
    assert ages.keys() == shown["outbox"]["backlog_by_lane"].keys()
    assert all(0 <= age <= shown["outbox"]["oldest_age_seconds"] + 1 for age in ages.values())

    code, out, err = status(identity_dsn)
    assert code == 0, err
    # Each task once: the split one is being walked (its other shards wait), the other waits.
    assert (shown["tasks"]["waiting"], shown["tasks"]["being_walked"]) == (1, 1)
    assert shown["tasks"]["walked_with_shards_waiting"] == 1
    for text in (
        "fan-out queue",
        "1 task(s), the longest for",
        "1 task(s) (1 with shards waiting for a worker)",
        "shards Pending",
        "backlog",
    ):
        assert text in out, text

    # The listings too, for scripts: one object per task; a task with its shards.
    env = service_environment(("IDENTITY_FANOUT_",), IDENTITY_FANOUT_DATABASE_DSN=identity_dsn)
    listed = run_cli("identity-fanout", ["tasks", "list", "--json"], env, timeout=60)
    tasks = [msgspec.json.decode(line) for line in listed.stdout.splitlines()]
    assert {t["status"] for t in tasks} == {"Pending", "InProgress"}
    split = next(t for t in tasks if t["shard_count"] == 3)
    shown = run_cli("identity-fanout", ["tasks", "show", split["id"], "--json"], env, timeout=60)
    detail = msgspec.json.decode(shown.stdout)
    assert detail["task"]["id"] == split["id"]
    assert [s["shard_no"] for s in detail["shards"]] == [1, 2, 3]
    assert sum(s["processed_count"] for s in detail["shards"]) == 10


def test_status_of_an_idle_system_and_outbox_status_json(identity_dsn: str) -> None:
    code, out, err = status(identity_dsn, "--json")
    assert code == 0, err
    shown = msgspec.json.decode(out)
    assert (shown["queue"]["backlog"], shown["shards"], shown["outbox"]["backlog"]) == (0, {}, 0)
    env = service_environment(("IDENTITY_FANOUT_",), IDENTITY_FANOUT_DATABASE_DSN=identity_dsn)
    outbox = run_cli("identity-fanout", ["outbox", "status", "--json"], env, timeout=60)
    assert msgspec.json.decode(outbox.stdout)["backlog"] == 0


def test_set_permissions_answers_in_json_for_scripts(db: Conn, identity_dsn: str) -> None:
    role, _ = seed_role_with_users(db, users=3, other_roles=0)
    add_permissions(db, ["deals.read"])
    env = service_environment(
        ("IDENTITY_FANOUT_",),
        IDENTITY_FANOUT_DATABASE_DSN=identity_dsn,
        IDENTITY_FANOUT_INLINE_FANOUT_THRESHOLD="0",
    )
    result = run_cli(
        "identity-fanout", ["roles", "set-permissions", str(role), "deals.read", "--json"], env
    )
    change = msgspec.json.decode(result.stdout)  # the result alone (the log is on stderr)
    # The users the queued task will notify, counted once the change committed.
    assert (change["role_id"], change["mode"], change["users"]) == (str(role), "queued", 3)
    assert change["task_id"]


def test_outbox_status_names_the_open_and_the_prepared_writers_holding_slots(
    db: Conn, identity_dsn: str, producer_dsn: str, operator_dsn: str, relay_dsn: str
) -> None:
    """As the operator's login, which may not read another login's transaction start: an
    open writer (the producer's login) is named with its slots and an unknown age, a
    prepared one with its gid and the time it was prepared; none once they ended."""
    assert outbox_json(operator_dsn)["open_writers"] == []
    assert not [line for line in outbox_text(operator_dsn) if "writer" in line]

    gid = f"status-writer-{uuid.uuid4().hex[:8]}"  # prepared transactions are cluster-wide
    with (
        psycopg.connect(producer_dsn, application_name="writers-test") as late,
        psycopg.connect(identity_dsn) as writer,
    ):
        OUTBOX.write(late, [outbox_message(access_event(key_in(5)), access_topic("t"))])
        # A raw INSERT in a two-phase transaction, as a DBA's session might leave it.
        key = str(key_in(9))
        writer.execute(
            "INSERT INTO identity.outbox (topic, message_key, payload, message_id, event_type,"
            " key_slot) VALUES ('t', %s, '\\x00', gen_random_uuid(), 'X',"
            " identity.outbox_key_slot(%s))",
            (key, key),
        )
        writer.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        try:
            shown = outbox_json(operator_dsn)["open_writers"]
            [prepared] = [w for w in shown if w["pid"] is None]
            [session] = [w for w in shown if w["pid"] is not None]
            assert session == {
                "pid": late.info.backend_pid,
                "gid": None,
                "slots": [5],
                "lanes": [5],
                "user_name": late.info.user,
                "application_name": "writers-test",
                # Another login's session: no pg_read_all_stats, so unknown, never a failure.
                "state": None,
                "since": None,
                "open_seconds": None,
                "long_open": None,
            }
            assert (prepared["gid"], prepared["slots"], prepared["lanes"]) == (gid, [9], [1])
            assert (prepared["user_name"], prepared["state"]) == (db.info.user, "prepared")
            assert prepared["since"] is not None
            assert 0 <= prepared["open_seconds"] < 60
            assert prepared["long_open"] is False

            lines = outbox_text(operator_dsn)
            [open_line] = [line for line in lines if f"open writer pid {session['pid']}" in line]
            assert "slots 5 (lanes 5): " in open_line
            assert f"{late.info.user} as writers-test, state unknown, open unknown (" in open_line
            [prepared_line] = [line for line in lines if f"prepared writer {gid}" in line]
            assert "slots 9 (lanes 1): " in prepared_line
            assert f"{db.info.user}, prepared " in prepared_line

            # A login with pg_read_all_stats (the relay's) sees the session's state and age.
            with psycopg.connect(relay_dsn, autocommit=True) as conn:
                seen = outbox_status(conn, OUTBOX).open_writers
            [known] = [w for w in seen if w.pid == session["pid"]]
            assert known.state == "idle in transaction"
            assert known.open_seconds is not None
            assert 0 <= known.open_seconds < 60
            assert known.long_open is False
        finally:
            left = db.execute("SELECT gid FROM pg_prepared_xacts WHERE gid = %s", (gid,))
            for (name,) in left.fetchall():
                db.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(name)))
        late.commit()

    assert outbox_json(operator_dsn)["open_writers"] == []
    assert not [line for line in outbox_text(operator_dsn) if "writer" in line]
