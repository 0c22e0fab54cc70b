"""Sharded fan-out of one large role on a real PostgreSQL: two workers, a killed worker,
a poisoned shard and its replay. Every user gets an event; none lost, at most one batch
repeated per fault."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from datetime import timedelta
from functools import partial
from pathlib import Path

import psycopg
import pytest
import worker_support
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from identity_fanout.errors import LeaseLostError
from identity_fanout.fanout.batch import BatchResult, run_batch
from identity_fanout.fanout.queue import FanoutQueue, Unit, list_shards, replay_task
from pin_testkit.seeding import seed_role_with_users
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
# Small batches and shards, so that a few hundred users make several of each.
new_worker = partial(worker_support.new_worker, batch_size=10, shard_size=100)
enqueue = worker_support.enqueue
stop_after = worker_support.stop_after
Running = worker_support.Running
task_row = worker_support.task_row
CLI = str(Path(sys.executable).with_name("identity-fanout"))


def event_users(db: Conn) -> Counter[uuid.UUID]:
    rows = db.execute("SELECT message_key FROM identity.outbox").fetchall()
    return Counter(uuid.UUID(row[0]) for row in rows)


def test_two_workers_share_a_three_shard_role_each_user_exactly_once(
    db: Conn,
    worker_dsn: str,
    operator_dsn: str,
    pool: ConnectionPool[Conn],
    caplog: pytest.LogCaptureFixture,
) -> None:
    role, users = seed_role_with_users(db, users=300, other_roles=1)
    task_id = enqueue(db, db, role)
    stop = threading.Event()
    # Each worker's first shard batch waits for the other's: proof that two shards of one
    # task are in flight at once, on two workers.
    both_busy = threading.Barrier(2, timeout=30)
    first_batch: set[int] = set()

    def meet(_unit: Unit, _result: BatchResult) -> None:
        me = threading.get_ident()
        if me not in first_batch:
            first_batch.add(me)
            both_busy.wait()

    # Short polling: a worker that looked before the split and missed its NOTIFY (LISTEN
    # starts with its first wait) still comes back for a shard in time.
    poll = timedelta(milliseconds=200)
    a, metrics_a = new_worker(worker_dsn, pool, stop, polling=poll, on_batch=meet)
    b, metrics_b = new_worker(worker_dsn, pool, stop, polling=poll, on_batch=meet)
    caplog.set_level(logging.INFO)
    with Running(a, b, stop=stop):
        wait_until(lambda: task_row(db, task_id)["status"] == "Completed", what="Completed")

    assert event_users(db) == Counter(users)
    task = task_row(db, task_id)
    assert (task["processed_count"], task["cursor"], task["shard_count"]) == (300, users[-1], 3)
    assert (task["lease_expires_at"], task["attempt_count"]) == (None, 1)
    shards = list_shards(db, task_id)
    assert [(s.shard_no, s.status, s.attempt_count) for s in shards] == [
        (1, "Completed", 1),
        (2, "Completed", 1),
        (3, "Completed", 1),
    ]
    # Bounds from the data: three equal shards of the 300 users.
    assert [s.processed_count for s in shards] == [100, 100, 100]
    assert [s.upper_bound for s in shards] == [users[99], users[199], None]
    # The task-level observations happen once, whichever worker finished the last shard.
    for name in ("size", "task_lag_seconds", "task_duration_ms"):
        counts = [getattr(m, name)._sum.get() for m in (metrics_a, metrics_b)]
        assert sum(1 for c in counts if c > 0) == 1, name
    assert metrics_a.size._sum.get() + metrics_b.size._sum.get() == 300
    completed = [m.tasks.labels(outcome="completed")._value.get() for m in (metrics_a, metrics_b)]
    assert sum(completed) == 1
    shard_runs = [m.shards.labels(outcome="completed")._value.get() for m in (metrics_a, metrics_b)]
    assert sum(shard_runs) == 3
    assert min(shard_runs) >= 1
    assert [r.getMessage() for r in caplog.records].count("task completed") == 1

    # What an operator sees: the task, and its shards below it.
    shown = subprocess.run(
        [CLI, "tasks", "show", str(task_id)],
        env={k: v for k, v in os.environ.items() if not k.startswith("IDENTITY_FANOUT_")}
        | {"IDENTITY_FANOUT_DATABASE_DSN": operator_dsn, "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "shard_count" in shown
    assert "shards" in shown
    assert shown.count("Completed") == 4  # the task and its three shards
    assert str(users[99]) in shown  # shard 1 ends where shard 2 starts


def test_a_worker_killed_mid_shard_loses_nobody(
    db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    batch = 20
    role, users = seed_role_with_users(db, users=6000, other_roles=0)
    task_id = enqueue(db, db, role)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDENTITY_FANOUT_")} | {
        "IDENTITY_FANOUT_DATABASE_DSN": worker_dsn,
        "IDENTITY_FANOUT_SHARD_SIZE": "2000",
        "IDENTITY_FANOUT_BATCH_SIZE": str(batch),
        "IDENTITY_FANOUT_MAX_LEASE_DURATION": "2s",
        "IDENTITY_FANOUT_METRICS_PORT": "0",
    }
    victim = subprocess.Popen(
        [CLI, "worker", "--no-relay"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: (
                db.execute(
                    "SELECT count(*) FROM identity.access_fanout_shards "
                    "WHERE status = 'InProgress' AND processed_count >= %s",
                    (2 * batch,),
                ).fetchone()
                == (1,)
            ),
            what="the worker to be inside a shard",
        )
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
    (held,) = [s for s in list_shards(db, task_id) if s.status == "InProgress"]
    # Killed inside the shard: some batches committed, the rest of the shard still to do.
    assert 2 * batch <= held.processed_count < 2000
    assert held.lease_expires_at is not None

    stop = threading.Event()
    survivor, metrics = new_worker(
        worker_dsn,
        pool,
        stop,
        batch_size=batch,
        shard_size=2000,
        lease=timedelta(seconds=2),
        polling=timedelta(milliseconds=200),
    )
    with Running(survivor, stop=stop):
        wait_until(lambda: task_row(db, task_id)["status"] == "Completed", what="Completed")

    delivered = event_users(db)
    assert set(delivered) == set(users)  # none lost
    repeated = sum(n - 1 for n in delivered.values())
    assert repeated <= batch  # at most the one batch in flight when the worker died
    task = task_row(db, task_id)
    assert (task["processed_count"], task["cursor"]) == (6000, users[-1])
    after = {s.shard_no: s for s in list_shards(db, task_id)}
    assert after[held.shard_no].attempt_count == 2  # re-claimed after the lease ran out
    assert all(s.status == "Completed" for s in after.values())
    assert metrics.tasks.labels(outcome="completed")._value.get() == 1


def test_a_poisoned_shard_fails_the_task_and_replay_finishes_it(
    db: Conn, operator_db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    role, users = seed_role_with_users(db, users=300, other_roles=0)
    task_id = enqueue(db, db, role)
    # A fault that hits one user of the middle shard on every attempt (a bad row, say).
    bad = users[150]
    db.execute(
        f"""
        CREATE FUNCTION identity.refuse_bad_user() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.message_key = '{bad}' THEN RAISE EXCEPTION 'bad user row'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_bad_user BEFORE INSERT ON identity.outbox
            FOR EACH ROW EXECUTE FUNCTION identity.refuse_bad_user();
        """
    )
    stop = threading.Event()
    worker, metrics = new_worker(
        worker_dsn, pool, stop, max_attempts=2, polling=timedelta(milliseconds=100)
    )
    with Running(worker, stop=stop):
        wait_until(lambda: task_row(db, task_id)["status"] == "Failed", what="Failed")

    task = task_row(db, task_id)
    assert str(task["last_error"]).startswith("shard 2: ")
    assert "bad user row" in str(task["last_error"])
    failed = [s for s in list_shards(db, task_id) if s.status == "Failed"]
    assert [(s.shard_no, s.attempt_count) for s in failed] == [(2, 2)]
    assert metrics.errors.labels(kind="poison")._value.get() == 1
    worker.refresh_gauges()
    assert metrics.failed_tasks._value.get() == 1
    assert bad not in event_users(db)

    # The runbook: fix the cause, then replay.
    db.execute("DROP TRIGGER refuse_bad_user ON identity.outbox")
    replayed = replay_task(operator_db, task_id)  # as the runbook's operator runs it
    assert (replayed.status, replayed.attempt_count) == ("InProgress", 0)
    assert [s.status for s in list_shards(db, task_id) if s.shard_no == 2] == ["Pending"]
    stop = threading.Event()
    finisher, finisher_metrics = new_worker(worker_dsn, pool, stop)
    with Running(finisher, stop=stop):
        wait_until(lambda: task_row(db, task_id)["status"] == "Completed", what="Completed")

    assert event_users(db) == Counter(users)  # failed batches rolled back: nobody twice
    task = task_row(db, task_id)
    assert (task["processed_count"], task["cursor"], task["last_error"]) == (300, users[-1], None)
    assert finisher_metrics.tasks.labels(outcome="completed")._value.get() == 1
    assert finisher_metrics.size._sum.get() == 300


def test_a_failed_split_is_retried_like_a_failed_batch(
    db: Conn, worker_dsn: str, pool: ConnectionPool[Conn], monkeypatch: pytest.MonkeyPatch
) -> None:
    role, users = seed_role_with_users(db, users=150, other_roles=0)
    task_id = enqueue(db, db, role)
    stop = threading.Event()
    worker, metrics = new_worker(worker_dsn, pool, stop, polling=timedelta(milliseconds=50))

    def failing_split(*args: object, **kwargs: object) -> int:
        raise RuntimeError("split went wrong")

    with monkeypatch.context() as patch:
        patch.setattr(FanoutQueue, "split", failing_split)
        assert worker.run_once()
    task = task_row(db, task_id)
    assert (task["status"], task["shard_count"], task["attempt_count"]) == ("InProgress", 0, 1)
    assert task["last_error"] == "RuntimeError: split went wrong"
    assert metrics.errors.labels(kind="batch")._value.get() == 1
    assert event_users(db) == Counter()

    with Running(worker, stop=stop):
        wait_until(lambda: task_row(db, task_id)["status"] == "Completed", what="Completed")
    assert event_users(db) == Counter(users)
    task = task_row(db, task_id)
    # Claimed twice as a whole (the failed split, then the split); once split, its
    # AttemptCount is its shards' highest: each shard was claimed once.
    assert (task["shard_count"], task["attempt_count"], task["processed_count"]) == (2, 1, 150)


def split_for_test(db: Conn, users: int, shard_size: int) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """A task of a role of ``users`` users, claimed and split into shards by this test."""
    role, ids = seed_role_with_users(db, users=users, other_roles=0)
    task_id = enqueue(db, db, role)
    queue = FanoutQueue(lease=timedelta(minutes=5), max_attempts=5)
    task = queue.claim(db)
    assert task is not None
    assert queue.split(db, task, shard_size=shard_size) == -(-users // shard_size)
    return task_id, ids


def test_a_stalled_worker_is_fenced_off_its_shard(db: Conn, worker_dsn: str) -> None:
    task_id, users = split_for_test(db, users=120, shard_size=60)
    queue = FanoutQueue(lease=timedelta(minutes=5), max_attempts=5)
    with psycopg.connect(worker_dsn) as stalled_conn:
        stalled = queue.claim(stalled_conn)
        assert stalled is not None
        assert stalled.shard_no is not None
        run_batch(stalled_conn, queue, stalled, batch_size=20, correlation_id="A")
        # The first worker stalls past its shard's lease; another claims the shard.
        db.execute(
            "UPDATE identity.access_fanout_shards SET lease_expires_at = now() - interval '1 s' "
            "WHERE id = %s",
            (stalled.id,),
        )
        successor = queue.claim(db)
        assert successor is not None
        assert successor.id == stalled.id
        assert successor.attempt == stalled.attempt + 1

        # ...and wakes up to commit its next batch: fenced off, nothing written.
        with pytest.raises(LeaseLostError):
            run_batch(stalled_conn, queue, stalled, batch_size=20, correlation_id="A")
    assert event_users(db) == Counter(users[:20])  # once each: the fenced batch wrote nothing
    assert task_row(db, task_id)["processed_count"] == 20


def test_a_stop_hands_the_shard_back_and_keeps_its_batches(
    db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]
) -> None:
    task_id, users = split_for_test(db, users=120, shard_size=60)
    stop = threading.Event()
    worker, metrics = new_worker(worker_dsn, pool, stop, on_batch=stop_after(2, stop))
    worker.run()

    first = list_shards(db, task_id)[0]
    assert (first.status, first.attempt_count, first.lease_expires_at) == ("Pending", 0, None)
    assert (first.processed_count, first.cursor) == (20, users[19])
    task = task_row(db, task_id)
    assert (task["status"], task["processed_count"], task["cursor"]) == (
        "InProgress",
        20,
        users[19],
    )
    assert metrics.shards.labels(outcome="released")._value.get() == 1
    successor, _ = new_worker(worker_dsn, pool, threading.Event())
    while successor.run_once():
        pass
    assert event_users(db) == Counter(users)
    assert task_row(db, task_id)["status"] == "Completed"


def test_small_roles_stay_one_unit(db: Conn, worker_dsn: str, pool: ConnectionPool[Conn]) -> None:
    role, users = seed_role_with_users(db, users=100, other_roles=0)
    task_id = enqueue(db, db, role)
    stop = threading.Event()
    worker, _ = new_worker(worker_dsn, pool, stop, shard_size=100)
    while worker.run_once():
        pass
    assert event_users(db) == Counter(users)
    task = task_row(db, task_id)
    assert (task["status"], task["shard_count"], task["processed_count"]) == ("Completed", 0, 100)
    assert list_shards(db, task_id) == []
