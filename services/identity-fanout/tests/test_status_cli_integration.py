"""`identity-fanout status` as an operator (and a script) reads it: the queue, the shards
being walked and the outbox, from a real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import psycopg
import pytest
from psycopg.rows import TupleRow
from worker_support import enqueue

from identity_fanout.fanout.batch import run_batch
from identity_fanout.fanout.queue import FanoutQueue
from pin_testkit.seeding import add_permissions, seed_role_with_users
from pin_testkit.service import run_cli, service_environment

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]


def status(dsn: str, *args: str) -> tuple[int, str, str]:
    env = service_environment(
        ("IDENTITY_FANOUT_",), IDENTITY_FANOUT_DATABASE_DSN=dsn, COLUMNS="200"
    )
    result = run_cli("identity-fanout", ["status", *args], env, timeout=60, check=False)
    return result.returncode, result.stdout, result.stderr


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
